//! `--graph -o FILE.dot`: the wait-for graph in Graphviz's DOT language
//! (`dot -Tsvg FILE.dot`). A node for each thread (or name, where threads
//! are many) and each source that is no thread (boxes); an edge for each
//! wait, labelled with its time and as thick as its share of the window;
//! the edges that count for the knots solid, the others dashed; the knots'
//! nodes filled, with `class="knot"`.

use std::io::{self, Write};

use crate::profile::{Profile, WaitGraph};

pub fn write(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let empty = WaitGraph::default();
    let g = profile.graph.as_deref().unwrap_or(&empty);
    let knot_of = |n: usize| g.knots.iter().position(|k| k.nodes.contains(&n));
    writeln!(out, "digraph waits {{")?;
    writeln!(out, "  rankdir=LR;")?;
    writeln!(out, "  node [fontname=\"Helvetica\", fontsize=11];")?;
    writeln!(out, "  edge [fontname=\"Helvetica\", fontsize=9];")?;
    for (i, n) in g.nodes.iter().enumerate() {
        let mut label = n.name.clone();
        if n.own_ns > 0 {
            label.push_str(&format!("\n{} {}", ms(n.own_ns), n.what));
        }
        let mut attrs = vec![format!("label={}", quoted(&label))];
        if n.pseudo {
            attrs.push("shape=box".into());
        }
        if let Some(k) = knot_of(i) {
            attrs.push("style=filled".into());
            attrs.push("fillcolor=\"#f4a582\"".into());
            attrs.push("class=\"knot\"".into());
            attrs.push(format!("knot={}", k + 1));
        }
        writeln!(out, "  n{i} [{}];", attrs.join(", "))?;
    }
    let window = g.window_ns.max(1) as f64;
    for &(a, b, ns) in &g.edges {
        let width = 1.0 + 5.0 * (ns as f64 / window).min(1.0);
        let style = if ns >= g.min_edge_ns {
            "solid"
        } else {
            "dashed"
        };
        writeln!(
            out,
            "  n{a} -> n{b} [label={}, penwidth={width:.1}, style={style}];",
            quoted(&ms(ns))
        )?;
    }
    writeln!(out, "}}")
}

/// A time in milliseconds, as the labels show it.
fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// A DOT string: quotes and backslashes escaped, line breaks as `\n`.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c if c.is_control() => {}
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Knot, WaitNode};

    #[test]
    fn a_graph_in_dot() {
        let node = |name: &str, pseudo: bool| WaitNode {
            name: name.into(),
            pseudo,
            own_ns: 0,
            what: String::new(),
        };
        let g = WaitGraph {
            nodes: vec![node("a \"x\" (1)", false), node("[timer]", true)],
            edges: vec![(0, 1, 2_000_000)],
            min_edge_ns: 1_000_000,
            knots: vec![Knot {
                nodes: vec![1],
                waited_ns: 2_000_000,
            }],
            window_ns: 4_000_000,
        };
        let profile = Profile {
            graph: Some(std::sync::Arc::new(g)),
            ..Profile::default()
        };
        let mut out = Vec::new();
        write(&profile, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("n0 [label=\"a \\\"x\\\" (1)\"];"), "{text}");
        assert!(
            text.contains("n1 [label=\"[timer]\", shape=box, style=filled"),
            "{text}"
        );
        assert!(text.contains("class=\"knot\", knot=1"), "{text}");
        assert!(
            text.contains("n0 -> n1 [label=\"2.0 ms\", penwidth=3.5, style=solid];"),
            "{text}"
        );
    }
}

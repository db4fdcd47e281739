//! `--graph`: the wait-for graph of the chains, and its knots (wPerf,
//! OSDI 2018): sets of nodes that wait for nobody outside themselves and
//! that others wait for. A thread that others wait for and that is itself
//! running, or a disk that every chain ends in, is such a set: where the
//! time goes, whatever waits on it.

use std::collections::{HashMap, HashSet};

use super::{End, Hop};
use crate::profile::{Knot, WaitGraph, WaitNode, Waker};
use crate::records::Named;

/// Beyond this many threads, the threads of one name are one node (a
/// pool's: the name without its number, see [`pool_name`]).
const MOST_THREAD_NODES: usize = 40;

/// An edge counts for the knots where its source waited at least this
/// share of the window (for a node of several threads, of their time).
const KNOT_EDGE_SHARE: f64 = 0.05;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Node {
    Thread(u32),
    Name(String),
    Source(End),
}

/// The nodes met so far, numbered in that order.
#[derive(Default)]
struct Nodes {
    ids: HashMap<Node, usize>,
    list: Vec<Node>,
    /// Each node's threads, its own time by what it was doing, the time
    /// others waited on it.
    threads: Vec<HashSet<u32>>,
    own: Vec<HashMap<String, u64>>,
    waited_on: Vec<u64>,
}

impl Nodes {
    fn id(&mut self, n: Node) -> usize {
        if let Some(&id) = self.ids.get(&n) {
            return id;
        }
        self.ids.insert(n.clone(), self.list.len());
        self.list.push(n);
        self.threads.push(HashSet::new());
        self.own.push(HashMap::new());
        self.waited_on.push(0);
        self.list.len() - 1
    }
}

/// The graph of the chains' `sums` (each distinct chain's time).
pub(super) fn of(sums: &HashMap<Vec<Hop>, (u64, u64)>, named: &Named, window_ns: u64) -> WaitGraph {
    let samples = &named.profile.samples;
    // Thread names, and whether threads are grouped by name.
    let mut names: HashMap<u32, &str> = HashMap::new();
    for (k, s) in named.keys.iter().zip(samples) {
        names.entry(k.pid).or_insert(s.thread_name());
        if let Some(Waker::Task { comm, pid, .. }) = &s.waker {
            names.entry(*pid).or_insert(comm);
        }
    }
    // (Grouped where the chains meet many threads.)
    let mut met: HashSet<u32> = HashSet::new();
    for path in sums.keys() {
        for hop in path {
            match *hop {
                Hop::Blocked(k) => met.insert(named.keys[k as usize].pid),
                Hop::Running(tid) => met.insert(tid),
                Hop::Sampled(k) => met.insert(named.keys[k as usize].pid),
                Hop::End(_) => false,
            };
        }
    }
    let grouped = met.len() > MOST_THREAD_NODES;
    let thread = |tid: u32| {
        if grouped {
            Node::Name(pool_name(names.get(&tid).copied().unwrap_or("?")).to_string())
        } else {
            Node::Thread(tid)
        }
    };
    let mut nodes = Nodes::default();
    let mut edges: HashMap<(usize, usize), u64> = HashMap::new();
    for (path, &(ns, _)) in sums {
        // The nodes along the chain, and what the last was doing.
        let mut seq: Vec<usize> = Vec::new();
        let mut what = String::new();
        for (i, hop) in path.iter().enumerate() {
            let (id, w) = match *hop {
                Hop::Blocked(k) => {
                    let tid = named.keys[k as usize].pid;
                    let id = nodes.id(thread(tid));
                    nodes.threads[id].insert(tid);
                    (
                        id,
                        crate::records::block_name(&samples[k as usize], &named.profile.objects),
                    )
                }
                Hop::Running(tid) => {
                    let id = nodes.id(thread(tid));
                    nodes.threads[id].insert(tid);
                    (id, super::RUNNING.to_string())
                }
                Hop::Sampled(k) => {
                    let tid = named.keys[k as usize].pid;
                    let id = nodes.id(thread(tid));
                    nodes.threads[id].insert(tid);
                    let name =
                        crate::records::block_name(&samples[k as usize], &named.profile.objects);
                    (id, format!("{} {name}", super::RUNNING))
                }
                Hop::End(e @ (End::Timer | End::Disk(_) | End::Network | End::Interrupt)) => {
                    let w = match seq.last() {
                        Some(&p) => format!("{} in {what}", display(&nodes.list[p], &names)),
                        None => String::new(),
                    };
                    (nodes.id(Node::Source(e)), w)
                }
                Hop::End(_) => continue,
            };
            if i > 0 {
                nodes.waited_on[id] += ns;
            }
            seq.push(id);
            what = w;
        }
        for pair in seq.windows(2) {
            if pair[0] != pair[1] {
                *edges.entry((pair[0], pair[1])).or_default() += ns;
            }
        }
        if let Some(&last) = seq.last() {
            *nodes.own[last].entry(what).or_default() += ns;
        }
    }
    let mut edges: Vec<(usize, usize, u64)> =
        edges.into_iter().map(|((a, b), ns)| (a, b, ns)).collect();
    edges.sort_unstable_by(|x, y| y.2.cmp(&x.2).then((x.0, x.1).cmp(&(y.0, y.1))));
    let min_edge_ns = (window_ns as f64 * KNOT_EDGE_SHARE) as u64;
    // An edge counts where its source waited that share of its threads'
    // time.
    let width = |n: usize| nodes.threads[n].len().max(1) as u64;
    let kept: Vec<(usize, usize)> = (edges.iter())
        .filter(|&&(a, _, ns)| ns >= min_edge_ns * width(a))
        .map(|e| (e.0, e.1))
        .collect();
    let mut knots: Vec<Knot> = sink_components(nodes.list.len(), &kept)
        .into_iter()
        .map(|c| Knot {
            waited_ns: c.iter().map(|&n| nodes.waited_on[n]).sum(),
            nodes: c,
        })
        // Waited on for a share of the window, as an edge must be.
        .filter(|k| k.waited_ns >= min_edge_ns)
        .collect();
    knots.sort_unstable_by(|a, b| b.waited_ns.cmp(&a.waited_ns).then(a.nodes.cmp(&b.nodes)));
    let shown = (0..nodes.list.len())
        .map(|i| {
            let own = &nodes.own[i];
            let what = own
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map_or(String::new(), |(w, _)| w.clone());
            WaitNode {
                name: match &nodes.list[i] {
                    Node::Name(name) => format!(
                        "{name} ({})",
                        crate::text::count(nodes.threads[i].len() as u64, "thread", "threads")
                    ),
                    other => display(other, &names),
                },
                pseudo: matches!(nodes.list[i], Node::Source(_)),
                own_ns: own.values().sum(),
                what,
            }
        })
        .collect();
    WaitGraph {
        nodes: shown,
        edges,
        min_edge_ns,
        knots,
        window_ns,
    }
}

/// The name of a pool that a thread named `comm` is one of: its name
/// without the numbers and separators it ends in (`worker-12`, `kworker/1:2`,
/// `pool-3-thread-7`: `worker`, `kworker`, `pool-3-thread`); the name itself
/// where nothing else is left.
fn pool_name(comm: &str) -> &str {
    let stem = comm.trim_end_matches(|c: char| {
        c.is_ascii_digit() || matches!(c, '-' | '_' | '/' | ':' | '.' | '#' | ' ')
    });
    if stem.is_empty() {
        comm
    } else {
        stem
    }
}

fn display(n: &Node, names: &HashMap<u32, &str>) -> String {
    match n {
        Node::Thread(tid) => format!("{} ({tid})", names.get(tid).copied().unwrap_or("?")),
        Node::Name(name) => name.clone(),
        Node::Source(e) => e.frame().to_string(),
    }
}

/// The strongly connected components of the graph (`n` nodes, `edges`)
/// with no edge leaving them, each sorted, in the order found (Tarjan's
/// algorithm, without recursion).
fn sink_components(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    let mut out_edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges {
        out_edges[a].push(b);
    }
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut comp_of = vec![usize::MAX; n];
    let (mut stack, mut next) = (Vec::new(), 0);
    let mut comps: Vec<Vec<usize>> = Vec::new();
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, its next edge to look at)
        let mut work = vec![(root, 0usize)];
        while let Some(&(v, at)) = work.last() {
            if at == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = out_edges[v].get(at) {
                if let Some(top) = work.last_mut() {
                    top.1 += 1;
                }
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp_of[w] = comps.len();
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                comp.sort_unstable();
                comps.push(comp);
            }
        }
    }
    let mut leaves = vec![true; comps.len()];
    for &(a, b) in edges {
        if comp_of[a] != comp_of[b] {
            leaves[comp_of[a]] = false;
        }
    }
    comps
        .into_iter()
        .zip(leaves)
        .filter_map(|(c, leaf)| leaf.then_some(c))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_named_without_their_numbers() {
        assert_eq!(pool_name("wl-client12"), "wl-client");
        assert_eq!(pool_name("kworker/1:2"), "kworker");
        assert_eq!(pool_name("pool-3-thread-7"), "pool-3-thread");
        assert_eq!(pool_name("tokio-runtime-w"), "tokio-runtime-w");
        assert_eq!(pool_name("1234"), "1234");
    }

    #[test]
    fn sink_components_are_the_knots() {
        // 0 -> 1 <-> 2, 3 -> 2: {1, 2} is the one knot; 4 alone is one.
        let edges = [(0, 1), (1, 2), (2, 1), (3, 2)];
        assert_eq!(sink_components(5, &edges), vec![vec![1, 2], vec![4]]);
        // A chain ending in a node: that node.
        assert_eq!(sink_components(3, &[(0, 1), (1, 2)]), vec![vec![2]]);
        // A cycle with a way out is no knot.
        assert_eq!(sink_components(3, &[(0, 1), (1, 0), (1, 2)]), vec![vec![2]]);
    }
}

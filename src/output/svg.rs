//! Flame graph SVG, drawn by inferno from the same folded stacks that `-f`
//! prints (kernel frames annotated so they can be coloured apart).

use std::io::{self, Write};

use inferno::flamegraph::color::{BasicPalette, Color, MultiPalette, PaletteMap};
use inferno::flamegraph::{self, Direction, Palette};

use super::folded::{
    self, HOT_KERNEL_ANNOTATION, HOT_USER_ANNOTATION, KERNEL_ANNOTATION, WAKER_ANNOTATION,
};
use super::Shape;
use crate::profile::{OffState, Origin, Part, Profile};

pub const DEFAULT_TITLE: &str = "Off-CPU Time Flame Graph";
pub const COUNT_NAME: &str = "us";
/// Pixel height of the `-` frame that `-d` puts between user and kernel
/// frames: a thin separator rather than a frame of its own.
const SEPARATOR_HEIGHT: u32 = 3;

/// What the flame-graph flags choose.
#[derive(Clone, Debug, PartialEq)]
pub struct SvgOptions {
    pub title: String,
    pub subtitle: Option<String>,
    /// Image width in pixels; `None` fills the browser window.
    pub width: Option<usize>,
    /// Frames narrower than this percentage of the total are left out.
    pub min_width: f64,
    /// Icicle graph: roots at the top.
    pub inverted: bool,
    /// Stacks reversed: the innermost frame at the root.
    pub reverse: bool,
    pub palette: Palette,
    /// What the widths count, as the tooltips name it: `us`, or `tasks`
    /// for `--snapshot`.
    pub count_name: String,
}

impl Default for SvgOptions {
    fn default() -> Self {
        SvgOptions {
            title: DEFAULT_TITLE.to_string(),
            subtitle: None,
            width: None,
            min_width: flamegraph::defaults::MIN_WIDTH,
            inverted: false,
            reverse: false,
            palette: Palette::Basic(BasicPalette::Io),
            count_name: COUNT_NAME.to_string(),
        }
    }
}

/// Palette names `--colors` takes.
pub const PALETTES: &[&str] = &[
    "io", "hot", "mem", "wakeup", "red", "green", "blue", "aqua", "yellow", "purple", "orange",
    "java", "js", "perl", "python", "rust",
];

pub fn parse_palette(name: &str) -> Result<Palette, String> {
    if !PALETTES.contains(&name) {
        return Err(format!(
            "unknown --colors palette {name:?} (one of: {})",
            PALETTES.join(", ")
        ));
    }
    name.parse()
}

/// A 64-bit FNV-1a hash of `name` scaled to [0, 1]: the same name gets the
/// same shade in every graph.
fn shade(name: &str) -> f32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 40) as f32 / (1u64 << 24) as f32
}

/// The colour of a kernel frame: orange beside the cool user palettes, aqua
/// beside the warm ones.
fn kernel_color(name: &str, user_palette: Palette) -> Color {
    let v = shade(name);
    let warm = matches!(
        user_palette,
        Palette::Basic(
            BasicPalette::Hot | BasicPalette::Red | BasicPalette::Orange | BasicPalette::Yellow
        )
    );
    let scale = |base: u8, range: f32| base + (range * v) as u8;
    if warm {
        Color {
            r: scale(50, 60.0),
            g: scale(165, 55.0),
            b: scale(165, 55.0),
        }
    } else {
        Color {
            r: scale(190, 65.0),
            g: scale(90, 65.0),
            b: 0,
        }
    }
}

/// Whether the palette colours `_[k]` frames itself.
/// The colour of a `--states` frame, apart from the user (blue) and
/// kernel (orange) frames: teal asleep, magenta in I/O, red blocked, green
/// waiting for a CPU, grey stopped.
fn state_color(state: OffState) -> Color {
    let (r, g, b) = match state {
        OffState::Sleep => (60, 190, 200),
        OffState::Io => (200, 90, 170),
        OffState::Blocked => (220, 60, 60),
        OffState::RunQueue => (70, 190, 90),
        OffState::Stopped => (160, 160, 160),
        OffState::Running => (230, 50, 30),
    };
    Color { r, g, b }
}

/// The colour of a frame of a running thread (`--on-cpu`): red to orange
/// in user code, yellow in the kernel, the hot half of a hot/cold graph
/// whose off-CPU half is blue and aqua.
fn hot_color(name: &str, kernel: bool) -> Color {
    if kernel {
        shaded(name, (225, 30.0), (185, 50.0), (0, 60.0))
    } else {
        shaded(name, (205, 50.0), (40, 120.0), (0, 40.0))
    }
}

/// The colour of a waker's frame (`--wakers`): yellow-green shades, apart
/// from the blocked thread's blue and orange.
fn waker_color(name: &str) -> Color {
    shaded(name, (190, 50.0), (215, 35.0), (80, 50.0))
}

/// A colour of a family: each component its base plus up to its range, by
/// the name's shade.
fn shaded(name: &str, r: (u8, f32), g: (u8, f32), b: (u8, f32)) -> Color {
    let v = shade(name);
    let scale = |(base, range): (u8, f32)| base + (range * v) as u8;
    Color {
        r: scale(r),
        g: scale(g),
        b: scale(b),
    }
}

/// The colour of a runtime's function's frame: its runtime's family (see
/// [`crate::runtime::Spec::colour`]), apart from the native frames' blue
/// and orange.
fn runtime_color(kind: crate::runtime::Kind, name: &str) -> Color {
    let [r, g, b] = kind.spec().colour;
    shaded(name, r, g, b)
}

fn palette_knows_kernel(p: Palette) -> bool {
    matches!(
        p,
        Palette::Multi(MultiPalette::Java | MultiPalette::Js | MultiPalette::Perl)
    )
}

pub fn write(
    profile: &Profile,
    shape: Shape,
    opts: &SvgOptions,
    w: &mut dyn Write,
) -> io::Result<()> {
    let stacks = folded::lines(profile, shape, true);

    let mut kernel_colors = frame_colors(profile, shape, opts, &stacks);

    let mut lines: Vec<String> = stacks
        .into_iter()
        .map(|(stack, us)| format!("{stack} {us}"))
        .collect();
    // inferno merges adjacent lines and expects them sorted.
    lines.sort_unstable();

    let mut o = flamegraph::Options::default();
    o.title = opts.title.clone();
    o.subtitle = opts.subtitle.clone();
    o.count_name = opts.count_name.clone();
    o.colors = opts.palette;
    o.deterministic = true;
    o.palette_map = Some(&mut kernel_colors);
    o.image_width = opts.width;
    o.min_width = opts.min_width;
    o.direction = if opts.inverted {
        Direction::Inverted
    } else {
        Direction::Straight
    };
    o.reverse_stack_order = opts.reverse;

    let mut svg = Vec::new();
    flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), &mut svg)?;
    let svg = String::from_utf8(svg).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    w.write_all(thin_separators(&svg, o.frame_height as u32).as_bytes())
}

/// The colours of frames that the palette does not choose: the states,
/// `--on-cpu`'s hot frames, the wakers', the containers', Python's, and the
/// kernel's where the palette has none for them.
fn frame_colors(
    profile: &Profile,
    shape: Shape,
    opts: &SvgOptions,
    stacks: &[(String, u64)],
) -> PaletteMap {
    let mut kernel_colors = PaletteMap::default();
    // The states of --states: one fixed colour each, whatever the palette.
    for state in [
        OffState::Sleep,
        OffState::Io,
        OffState::Blocked,
        OffState::RunQueue,
        OffState::Stopped,
        OffState::Running,
    ] {
        kernel_colors.insert(state.frame(), state_color(state));
    }
    // --on-cpu: the running threads' frames hot, and the off-CPU kernel
    // frames aqua rather than orange, so that the two halves part.
    let hot_cold = profile
        .samples
        .iter()
        .any(|s| s.state == Some(OffState::Running));
    for (stack, _) in stacks {
        for frame in stack.split(';') {
            let kernel = frame.ends_with(HOT_KERNEL_ANNOTATION);
            if (kernel || frame.ends_with(HOT_USER_ANNOTATION))
                && kernel_colors.get(frame).is_none()
            {
                kernel_colors.insert(frame, hot_color(&frame[..frame.len() - 4], kernel));
            }
        }
    }
    // The waker's part (--wakers): a colour family of its own.
    kernel_colors.insert(
        folded::WAKER_SEPARATOR,
        Color {
            r: 160,
            g: 160,
            b: 160,
        },
    );
    for (stack, _) in stacks {
        for frame in stack.split(';').filter(|f| f.ends_with(WAKER_ANNOTATION)) {
            if kernel_colors.get(frame).is_none() {
                kernel_colors.insert(frame, waker_color(frame));
            }
        }
    }
    // The containers' root frames (--per-container): one sand colour.
    if shape.per_container {
        for sample in &profile.samples {
            let frame = folded::clean(&crate::shape::container_frame(sample));
            if kernel_colors.get(&frame).is_none() {
                kernel_colors.insert(
                    frame,
                    Color {
                        r: 200,
                        g: 185,
                        b: 150,
                    },
                );
            }
        }
    }
    // Runtimes' functions (Python's in place of the interpreter's
    // frames): each runtime's shades, apart from the native frames.
    for sample in &profile.samples {
        if let Part::Frames(frames) = &sample.user {
            for f in frames.iter() {
                let Origin::Runtime(kind) = f.origin else {
                    continue;
                };
                let text = folded::clean(f.text());
                if kernel_colors.get(&text).is_none() {
                    let color = runtime_color(kind, &text);
                    kernel_colors.insert(text, color);
                }
            }
        }
    }
    if !palette_knows_kernel(opts.palette) {
        for (stack, _) in stacks {
            for frame in stack.split(';').filter(|f| f.ends_with(KERNEL_ANNOTATION)) {
                if kernel_colors.get(frame).is_none() {
                    let palette = if hot_cold {
                        Palette::Basic(BasicPalette::Hot)
                    } else {
                        opts.palette
                    };
                    kernel_colors.insert(frame, kernel_color(frame, palette));
                }
            }
        }
    }
    kernel_colors
}

/// Redraws each `-` frame (the `-d` delimiter) as a thin bar centred in
/// its row, with its label hidden.
fn thin_separators(svg: &str, frame_height: u32) -> String {
    const MARK: &str = "<title>- (";
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(at) = rest.find(MARK) {
        let (head, tail) = rest.split_at(at);
        out.push_str(head);
        let Some(end) = tail.find("</g>") else {
            rest = tail;
            break;
        };
        out.push_str(&thin_frame(&tail[..end], frame_height));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// One frame's `<title>…<rect …/><text …>-</text>` with a thin rect and a
/// hidden label; anything unexpected is left as it is.
fn thin_frame(frame: &str, frame_height: u32) -> String {
    let Some(rect_at) = frame.find("<rect ") else {
        return frame.to_string();
    };
    let Some(rect_len) = frame[rect_at..].find("/>") else {
        return frame.to_string();
    };
    let rect = &frame[rect_at..rect_at + rect_len];
    let attr = |name: &str| -> Option<(usize, usize, u32)> {
        let key = format!(" {name}=\"");
        let start = rect.find(&key)? + key.len();
        let len = rect[start..].find('"')?;
        Some((start, start + len, rect[start..start + len].parse().ok()?))
    };
    let (Some(y), Some(h)) = (attr("y"), attr("height")) else {
        return frame.to_string();
    };
    let height = SEPARATOR_HEIGHT.min(h.2);
    let top = y.2 + (frame_height.min(h.2) - height) / 2;
    // Rewrite the later attribute first so the earlier offsets stay valid.
    let mut edits = [(y, top), (h, height)];
    edits.sort_by_key(|e| std::cmp::Reverse(e.0 .0));
    let mut new_rect = rect.to_string();
    for ((start, end, _), value) in edits {
        new_rect.replace_range(start..end, &value.to_string());
    }
    let mut out = String::with_capacity(frame.len());
    out.push_str(&frame[..rect_at]);
    out.push_str(&new_rect);
    // The viewer's script rewrites labels from the title on every zoom, so
    // the label is hidden rather than emptied.
    out.push_str(&frame[rect_at + rect_len..].replace("<text ", "<text visibility=\"hidden\" "));
    out
}

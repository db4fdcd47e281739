//! Renderings of a [`Profile`](crate::profile::Profile).

pub mod dot;
pub mod folded;
pub mod group;
pub mod otlp;
pub mod otlp_proto;
pub mod pprof;
pub mod profile_proto;
pub mod sink;
pub mod snapshot;
pub mod speedscope;
pub mod svg;
pub mod text;

pub use crate::shape::{leaf_first, Shape};

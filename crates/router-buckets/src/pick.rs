//! What a bucket hands back: a complete engine selection.

use std::sync::Arc;

use router_policy::Pick;

/// A complete engine selection from one bucket.
#[derive(Debug)]
pub struct BucketPick {
    /// The bucket both picks came from.
    pub bucket: Arc<str>,
    /// The engine, or the prefill/decode pair.
    pub engines: EnginePicks,
}

/// One plain engine, or a prefill and a decode engine.
#[derive(Debug)]
pub enum EnginePicks {
    /// A plain bucket's pick.
    Plain(Pick),
    /// A PD bucket's pair.
    Pd {
        /// The prefill engine.
        prefill: Pick,
        /// The decode engine.
        decode: Pick,
    },
}

impl EnginePicks {
    /// The picks in dispatch order (prefill before decode).
    pub fn iter(&self) -> impl Iterator<Item = &Pick> {
        let (first, second) = match self {
            EnginePicks::Plain(pick) => (pick, None),
            EnginePicks::Pd { prefill, decode } => (prefill, Some(decode)),
        };
        std::iter::once(first).chain(second)
    }
}

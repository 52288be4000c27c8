//! `cargo xtask bench [criterion args]`: the criterion benches in release mode, after
//! preparing the test cache (the tokenization bench reads the Qwen3 tokenizer).

use std::path::Path;

use crate::{cargo, step};

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    crate::python::prepare(root)?;
    step(
        "criterion benches",
        cargo()
            .args(["bench", "--locked", "-p", "switchyard-benches", "--"])
            .args(args),
    )
}

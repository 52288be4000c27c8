//! `cargo xtask bench [criterion args]`: the criterion benches in release mode, after
//! preparing the test cache (the tokenization bench reads the Qwen3 tokenizer).

use std::path::Path;

use crate::{cargo, step};

pub(crate) fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    if !crate::python::cache_dir(root)
        .join("qwen3/.complete")
        .exists()
    {
        crate::python::prepare(root)?;
    }
    step(
        "criterion benches",
        cargo()
            .args(["bench", "--locked", "-p", "switchyard-benches", "--"])
            .args(args),
    )
}

//! `cargo xtask bench [criterion args]`: the criterion benches in release mode.

use crate::{cargo, step};

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    step(
        "criterion benches",
        cargo()
            .args(["bench", "--locked", "-p", "switchyard-benches", "--"])
            .args(args),
    )
}

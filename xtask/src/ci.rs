//! `cargo xtask ci`: every check CI runs, from a clean clone.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::{cargo, step};

/// cargo-deny is built from crates.io into this cache on first use.
const DENY_VERSION: &str = "0.20.2";

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    step("format", cargo().args(["fmt", "--all", "--", "--check"]))?;
    step(
        "clippy",
        cargo().args([
            "clippy",
            "--locked",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    let python = crate::python::prepare(root)?;
    step(
        "tests",
        cargo().args([
            "nextest",
            "run",
            "--locked",
            "--workspace",
            "--no-fail-fast",
            "--profile",
            "ci",
        ]),
    )?;
    // The fuzz crate is its own workspace; it starts from the main lockfile so it
    // builds the same dependency versions, plus its harness.
    std::fs::copy(root.join("Cargo.lock"), root.join("fuzz/Cargo.lock"))
        .context("seeding fuzz/Cargo.lock from Cargo.lock")?;
    step(
        "fuzz targets compile (fuzz/, run with cargo +nightly fuzz)",
        cargo().args(["check", "--manifest-path", "fuzz/Cargo.toml"]),
    )?;
    step(
        "doc tests",
        cargo().args(["test", "--locked", "--workspace", "--doc"]),
    )?;
    crate::python::test(root, &python)?;
    eprintln!("==> tidy");
    crate::tidy::run(root)?;
    let deny = ensure_cargo_deny(root)?;
    step(
        "fetch every platform's dependencies",
        cargo().args(["fetch", "--locked"]),
    )?;
    step(
        "licences, bans and sources (cargo deny)",
        Command::new(deny).args(["--offline", "check", "bans", "licenses", "sources"]),
    )?;
    eprintln!("ci passed");
    Ok(())
}

/// The cargo-deny binary: from PATH if installed, else built into `.cache/tools`.
fn ensure_cargo_deny(root: &Path) -> anyhow::Result<std::path::PathBuf> {
    let on_path = Command::new("cargo-deny").arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success()) {
        return Ok("cargo-deny".into());
    }
    let tools = root.join(".cache/tools");
    let cached = tools.join("bin/cargo-deny");
    if !cached.exists() {
        step(
            &format!("install cargo-deny {DENY_VERSION} (first run only)"),
            cargo()
                .args([
                    "install",
                    "--locked",
                    "--quiet",
                    "--version",
                    DENY_VERSION,
                    "cargo-deny",
                    "--root",
                ])
                .arg(&tools),
        )
        .context("cargo-deny is needed to check licences, bans and sources")?;
    }
    Ok(cached)
}

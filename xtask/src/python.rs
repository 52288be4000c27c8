//! The Python side of the suite: a venv with pinned packages, third-party test data
//! (the real SGLang publisher modules, a real tokenizer), and pytest over `tests/python`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::step;

/// Where the venv and the third-party test data live: `SWITCHYARD_CACHE` if set, else
/// `.cache` in the workspace root.
pub(crate) fn cache_dir(root: &Path) -> PathBuf {
    std::env::var_os("SWITCHYARD_CACHE").map_or_else(|| root.join(".cache"), PathBuf::from)
}

/// Installs what the Python tests (and the Rust tests that drive the real engine
/// publishers or load the Qwen3 tokenizer) need into the cache: the venv with pinned
/// packages and the third-party test data. Returns the venv's interpreter.
pub(crate) fn prepare(root: &Path) -> anyhow::Result<PathBuf> {
    let cache = cache_dir(root);
    let python = venv(&cache)?;
    step(
        "python packages (tests/python/requirements.txt)",
        pip_install(&python, &cache).args(["-r", "tests/python/requirements.txt"]),
    )?;
    step(
        "third-party test data (SGLang and vLLM publishers, Qwen3 tokenizer)",
        Command::new(&python)
            .arg("tests/python/fetch_testdata.py")
            .arg(&cache),
    )?;
    Ok(python)
}

/// Runs the Python tests against `switchyard`, a binary the caller has built.
pub(crate) fn test(root: &Path, python: &Path, switchyard: &Path) -> anyhow::Result<()> {
    let cache = cache_dir(root);
    step(
        "python tests (router end to end, routing policies, openai client, SGLang conformance, tokenizer parity)",
        Command::new(python)
            .args(["-m", "pytest", "tests/python", "-q"])
            .env("SWITCHYARD_BIN", switchyard)
            .env("SWITCHYARD_CACHE", &cache),
    )
}

/// `pip install` into the venv of `python`, quietly, with the wheel cache under `cache`
/// (the packages to install are the caller's arguments).
pub(crate) fn pip_install(python: &Path, cache: &Path) -> Command {
    let mut command = Command::new(python);
    command
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--cache-dir",
        ])
        .arg(cache.join("pip"));
    command
}

/// The venv's interpreter, creating the venv on first use.
fn venv(cache: &Path) -> anyhow::Result<PathBuf> {
    let dir = cache.join("venv");
    let python = dir.join("bin/python");
    if !python.exists() {
        step(
            "create the python venv (venv in the cache)",
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
        )
        .context("python3 with the venv module is needed for the Python tests")?;
    }
    Ok(python)
}

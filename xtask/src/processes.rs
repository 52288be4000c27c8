//! Processes the load tasks start: the release binaries' directory, starting a
//! process that announces itself with a JSON ready line, stopping it by pid, and its
//! resident memory.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::{cargo, cargo_metadata, step};

/// A process under test, stopped on drop.
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) process: Option<Child>,
}

impl Drop for Target {
    #[allow(
        clippy::disallowed_methods,
        reason = "a bench tool gives processes a moment to exit"
    )]
    fn drop(&mut self) {
        if let Some(child) = &mut self.process {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Cargo's target directory, `CARGO_TARGET_DIR` and `build.target-dir` included.
pub(crate) fn target_dir() -> anyhow::Result<PathBuf> {
    let metadata: serde_json::Value =
        serde_json::from_slice(&cargo_metadata()?).context("parsing cargo metadata")?;
    let target = metadata["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    Ok(PathBuf::from(target))
}

/// Where cargo puts the binaries of `profile` ("debug", "release").
pub(crate) fn profile_dir(profile: &str) -> anyhow::Result<PathBuf> {
    Ok(target_dir()?.join(profile))
}

/// Builds the release `switchyard` and makes `target/<task>` for a load task's files;
/// returns the binary and that directory.
pub(crate) fn release_switchyard(task: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    step(
        "build switchyard (release)",
        cargo().args([
            "build",
            "--locked",
            "--release",
            "-p",
            "switchyard",
            "--bin",
            "switchyard",
        ]),
    )?;
    let release = profile_dir("release")?;
    let dir = release.with_file_name(task);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok((release.join("switchyard"), dir))
}

/// Spawns a process that prints one JSON ready line on stdout, its stderr going to
/// `stderr`; returns it and the line.
pub(crate) fn spawn_ready(
    mut command: Command,
    stderr: Stdio,
) -> anyhow::Result<(Child, serde_json::Value)> {
    let mut child = command.stdout(Stdio::piped()).stderr(stderr).spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    Ok((
        child,
        serde_json::from_str(&line).with_context(|| format!("ready line {line:?}"))?,
    ))
}

pub(crate) fn json_field(value: &serde_json::Value, path: &[&str]) -> anyhow::Result<String> {
    let field = path.iter().fold(value, |v, key| &v[key]);
    field
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no {} in {value}", path.join(".")))
}

/// Resident memory of one process in KiB (`VmRSS` of `/proc/<pid>/status`).
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    status_field(pid, "VmRSS:")?
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

/// One field of `/proc/<pid>/status` (`Threads:`, say), trimmed.
pub(crate) fn status_field(pid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|value| value.trim().to_owned())
}

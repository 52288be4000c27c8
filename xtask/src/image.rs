//! The container image in `cargo xtask ci`. No container engine runs in CI, so the
//! Dockerfile is read as Docker reads it and held to the image's rules (two stages on
//! one Debian release, the pinned toolchain, a numeric non-root user, the binary as
//! the entry point), and its build stage is replayed outside a container: the files
//! that stage copies, less what `.dockerignore` leaves out, are laid out as the stage
//! would see them and the stage's one command, `deploy/docker/build.sh`, runs on them.
//! The binary that makes is the one the Python tests run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

use crate::step;

#[cfg(test)]
mod tests;

/// The script the build stage runs, with the directory to put the binary in.
const BUILD_SCRIPT: &str = "deploy/docker/build.sh";
/// The build stage's working directory, below which its files are copied.
const WORKDIR: &str = "/src";
/// Debian releases, each with the names base images give it.
const DEBIAN: &[(&str, &[&str])] = &[
    ("bookworm", &["bookworm", "debian12"]),
    ("trixie", &["trixie", "debian13"]),
];

/// What the Dockerfile's build stage does, as far as CI repeats it.
#[derive(Debug)]
pub(crate) struct BuildStage {
    /// Its copies from the build context.
    copies: Vec<Copy>,
}

/// A build-stage `COPY` from the build context.
#[derive(Debug, PartialEq)]
struct Copy {
    /// Paths in the context.
    sources: Vec<String>,
    /// Below [`WORKDIR`]; empty for [`WORKDIR`] itself.
    destination: String,
    /// Whether the destination is a directory the sources go into.
    into_directory: bool,
}

/// Reads `Dockerfile` and `rust-toolchain.toml` under `root` and checks the image's
/// rules; the build stage CI repeats.
pub(crate) fn check(root: &Path) -> anyhow::Result<BuildStage> {
    let read =
        |name: &str| fs::read_to_string(root.join(name)).with_context(|| format!("reading {name}"));
    check_dockerfile(
        &read("Dockerfile")?,
        &toolchain(&read("rust-toolchain.toml")?)?,
    )
    .context("Dockerfile")
}

/// Lays out the build stage's files in `<target>/image-context`, as `.dockerignore`
/// leaves them, and runs the stage's script on them; the binary it made.
pub(crate) fn build(root: &Path, stage: &BuildStage) -> anyhow::Result<PathBuf> {
    let target = crate::processes::target_dir()?;
    let context = target.join("image-context");
    let ignore = Ignore::parse(
        &fs::read_to_string(root.join(".dockerignore")).context("reading .dockerignore")?,
    )?;
    if context.exists() {
        fs::remove_dir_all(&context).with_context(|| format!("removing {}", context.display()))?;
    }
    for each in &stage.copies {
        copy(root, each, &ignore, &context)?;
    }
    let out = target.join("image");
    let binary = out.join("switchyard");
    if binary.exists() {
        fs::remove_file(&binary).with_context(|| format!("removing {}", binary.display()))?;
    }
    step(
        &format!("the image's build ({BUILD_SCRIPT} on the files the Dockerfile copies)"),
        Command::new("sh")
            .arg(context.join(BUILD_SCRIPT))
            .arg(&out)
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_INCREMENTAL", "0"),
    )?;
    Ok(binary)
}

/// The `channel` of rust-toolchain.toml.
fn toolchain(text: &str) -> anyhow::Result<String> {
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .next()
        .context("rust-toolchain.toml names no channel")
}

/// One instruction: its keyword (upper case) and its arguments, continuation lines
/// joined.
#[derive(Debug, PartialEq)]
struct Instruction {
    keyword: String,
    args: String,
}

/// The instructions of a Dockerfile: comments and blank lines skipped, lines ending
/// in `\` joined to the next.
fn instructions(text: &str) -> Vec<Instruction> {
    let mut all = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (part, continues) = line
            .strip_suffix('\\')
            .map_or((line, false), |part| (part, true));
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(part.trim());
        if !continues {
            all.push(instruction(&std::mem::take(&mut current)));
        }
    }
    if !current.is_empty() {
        all.push(instruction(&current));
    }
    all
}

fn instruction(line: &str) -> Instruction {
    let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    Instruction {
        keyword: keyword.to_ascii_uppercase(),
        args: args.trim().to_owned(),
    }
}

/// A stage: its base image, its name and its instructions after `FROM`.
#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    body: Vec<Instruction>,
}

fn stages(instructions: Vec<Instruction>) -> anyhow::Result<Vec<Stage>> {
    let mut stages: Vec<Stage> = Vec::new();
    for instruction in instructions {
        if instruction.keyword == "FROM" {
            let words: Vec<&str> = instruction
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let (base, name) = match words[..] {
                [base] => (base, None),
                [base, r#as, name] if r#as.eq_ignore_ascii_case("as") => (base, Some(name)),
                _ => bail!("FROM {}: expected `FROM image [AS name]`", instruction.args),
            };
            stages.push(Stage {
                base: base.to_owned(),
                name: name.map(str::to_owned),
                body: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.body.push(instruction);
        } else if instruction.keyword != "ARG" {
            bail!("{} before the first FROM", instruction.keyword);
        }
    }
    Ok(stages)
}

/// The Debian release an image is based on, from its name.
fn debian_release(image: &str) -> Option<&'static str> {
    DEBIAN
        .iter()
        .find(|(_, names)| names.iter().any(|name| image.contains(name)))
        .map(|(release, _)| *release)
}

/// The image's rules (see the module's docs); the build stage CI repeats.
fn check_dockerfile(text: &str, channel: &str) -> anyhow::Result<BuildStage> {
    let stages = stages(instructions(text))?;
    let [build, runtime] = &stages[..] else {
        bail!(
            "expected two stages, a build and a runtime one; found {}",
            stages.len()
        );
    };
    let version = build
        .base
        .strip_prefix("rust:")
        .and_then(|tag| tag.split('-').next())
        .with_context(|| format!("the build stage's base {} is no rust image", build.base))?;
    ensure!(
        version == channel,
        "the build stage's base {} is not the toolchain rust-toolchain.toml pins ({channel})",
        build.base
    );
    let release = debian_release(&build.base).with_context(|| {
        format!(
            "the build stage's base {} names no Debian release",
            build.base
        )
    })?;
    ensure!(
        debian_release(&runtime.base) == Some(release),
        "the runtime's base {} is not on {release}, the build stage's Debian release (glibc \
         must be as new where the binary runs as where it was linked)",
        runtime.base
    );
    let (stage, out) = check_build_stage(build)?;
    let name = build
        .name
        .as_deref()
        .context("the build stage has no name (FROM ... AS build)")?;
    check_runtime(runtime, name, &out)?;
    Ok(stage)
}

/// The build stage holds only its working directory, copies from the build context
/// and one run of the build script: CI repeats nothing else.
fn check_build_stage(stage: &Stage) -> anyhow::Result<(BuildStage, String)> {
    let mut copies = Vec::new();
    let mut run = None;
    let mut workdir = None;
    for instruction in &stage.body {
        match instruction.keyword.as_str() {
            "WORKDIR" => workdir = Some(instruction.args.clone()),
            "COPY" => {
                ensure!(
                    workdir.as_deref() == Some(WORKDIR),
                    "the build stage copies into WORKDIR {WORKDIR}"
                );
                copies.push(build_copy(&instruction.args)?);
            }
            "RUN" => {
                ensure!(run.is_none(), "the build stage runs one command");
                ensure!(
                    workdir.as_deref() == Some(WORKDIR),
                    "the build stage runs in WORKDIR {WORKDIR}"
                );
                run = Some(instruction.args.clone());
            }
            other => bail!(
                "{other} in the build stage: it may hold only WORKDIR, COPY and the RUN of \
                 {BUILD_SCRIPT} (CI repeats nothing else)"
            ),
        }
    }
    let run = run.context("the build stage runs nothing")?;
    // Cache mounts keep crates and builds between builds; any other mount or option
    // would give the build what CI does not.
    let words: Vec<&str> = run
        .split_whitespace()
        .filter(|w| !w.starts_with("--mount=type=cache,"))
        .collect();
    let ["sh", BUILD_SCRIPT, out] = words[..] else {
        bail!("the build stage's RUN is `{run}`, not `sh {BUILD_SCRIPT} OUT_DIR`");
    };
    ensure!(
        out.starts_with('/'),
        "the build script's OUT_DIR {out} is not absolute"
    );
    let copies_script = copies
        .iter()
        .any(|c| c.sources == [BUILD_SCRIPT] && c.destination == BUILD_SCRIPT && !c.into_directory);
    ensure!(
        copies_script,
        "the build stage does not copy {BUILD_SCRIPT} to {BUILD_SCRIPT}"
    );
    Ok((BuildStage { copies }, out.to_owned()))
}

/// A build-stage `COPY`: plain paths of the context, to a destination below
/// [`WORKDIR`].
fn build_copy(args: &str) -> anyhow::Result<Copy> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let Some((destination, sources)) = words.split_last() else {
        bail!("COPY without arguments");
    };
    ensure!(
        !sources.is_empty()
            && sources
                .iter()
                .all(|s| !s.starts_with("--") && !s.starts_with('[')),
        "COPY {args}: the build stage copies plain paths of the build context, with no options"
    );
    for source in sources {
        ensure!(
            !source.starts_with('/')
                && !source.split('/').any(|part| part == "..")
                && !source.contains(['*', '?', '[']),
            "COPY {args}: {source} is not a plain path in the build context"
        );
    }
    let relative = if *destination == WORKDIR {
        ""
    } else {
        destination
            .strip_prefix(&format!("{WORKDIR}/"))
            .unwrap_or(destination)
    };
    ensure!(
        !relative.starts_with('/'),
        "COPY {args}: the destination is outside {WORKDIR}"
    );
    let relative = relative.trim_start_matches("./");
    let relative = if relative == "." { "" } else { relative };
    Ok(Copy {
        sources: sources.iter().map(|s| (*s).to_owned()).collect(),
        destination: relative.trim_end_matches('/').to_owned(),
        into_directory: sources.len() > 1 || destination.ends_with('/') || relative.is_empty(),
    })
}

/// The runtime stage takes the binary from `out` in the build stage, runs it as a
/// numeric non-root user, and starts it.
fn check_runtime(stage: &Stage, build: &str, out: &str) -> anyhow::Result<()> {
    let find = |keyword: &str| {
        stage
            .body
            .iter()
            .filter(|i| i.keyword == keyword)
            .map(|i| i.args.as_str())
            .next_back()
    };
    let binary = format!("{out}/switchyard");
    let installed = stage
        .body
        .iter()
        .filter(|i| i.keyword == "COPY")
        .find_map(
            |i| match i.args.split_whitespace().collect::<Vec<_>>()[..] {
                [from, source, destination]
                    if from == format!("--from={build}") && source == binary =>
                {
                    Some(destination.to_owned())
                }
                _ => None,
            },
        )
        .with_context(|| format!("the runtime stage does not COPY --from={build} {binary}"))?;
    let user = find("USER").context("the runtime stage sets no USER (it would run as root)")?;
    let ids: Vec<&str> = user.split(':').collect();
    ensure!(
        ids.len() <= 2 && ids.iter().all(|id| id.parse::<u32>().is_ok()) && ids[0] != "0",
        "USER {user}: a numeric user other than root (Kubernetes' runAsNonRoot checks it)"
    );
    let exec_form = |keyword: &str| -> anyhow::Result<Vec<String>> {
        let args = find(keyword).with_context(|| format!("the runtime stage has no {keyword}"))?;
        serde_json::from_str(args).with_context(|| {
            format!("{keyword} {args}: the exec form, a JSON array (the image has no shell)")
        })
    };
    ensure!(
        exec_form("ENTRYPOINT")? == [installed.as_str()],
        "the ENTRYPOINT is not [\"{installed}\"], the binary"
    );
    ensure!(
        exec_form("CMD")?.first().is_some_and(|c| c == "serve"),
        "CMD does not start with serve"
    );
    let exposed = find("EXPOSE").context("the runtime stage EXPOSEs no port")?;
    ensure!(
        exposed
            .split_whitespace()
            .all(|port| port.parse::<u16>().is_ok()),
        "EXPOSE {exposed}: TCP port numbers"
    );
    Ok(())
}

/// Copies what one build-stage `COPY` takes from `root` into `context`, as Docker
/// would: a directory's content into the destination directory, a file to the
/// destination (or into it, when it is a directory). Modification times are kept, so
/// that cargo rebuilds only what changed since the last run.
fn copy(root: &Path, each: &Copy, ignore: &Ignore, context: &Path) -> anyhow::Result<()> {
    let destination = if each.destination.is_empty() {
        context.to_path_buf()
    } else {
        context.join(&each.destination)
    };
    for source in &each.sources {
        let path = root.join(source);
        ensure!(
            path.exists(),
            "the Dockerfile copies {source}, which does not exist"
        );
        let files = files(root, &path)?;
        let mut copied = 0;
        for file in files {
            let relative = file
                .strip_prefix(root)?
                .to_string_lossy()
                .replace('\\', "/");
            if ignore.excludes(&relative) {
                continue;
            }
            let into = if path.is_dir() {
                destination.join(file.strip_prefix(&path)?)
            } else if each.into_directory {
                destination.join(path.file_name().context("a file name")?)
            } else {
                destination.clone()
            };
            fs::create_dir_all(into.parent().context("a parent directory")?)?;
            fs::copy(&file, &into).with_context(|| format!("copying {relative}"))?;
            let modified = fs::metadata(&file)?.modified()?;
            fs::File::options()
                .write(true)
                .open(&into)?
                .set_modified(modified)?;
            copied += 1;
        }
        ensure!(
            copied > 0,
            "the Dockerfile copies {source}, all of which .dockerignore leaves out"
        );
    }
    Ok(())
}

/// Every file under `path` (itself, when it is a file), sorted.
fn files(root: &Path, path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in fs::read_dir(&path).with_context(|| {
                format!(
                    "reading {}",
                    path.strip_prefix(root).unwrap_or(&path).display()
                )
            })? {
                stack.push(entry?.path());
            }
        } else {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// `.dockerignore` as Docker reads it: a pattern a line (`#` comments and blank lines
/// skipped), relative to the context's root; `*` and `?` match within a path element,
/// `**` any number of elements; a path is left out when the last pattern matching it
/// or one of its parent directories does not start with `!`.
#[derive(Debug)]
struct Ignore {
    /// Each pattern's elements, and whether it leaves out (not `!`).
    patterns: Vec<(Vec<String>, bool)>,
}

impl Ignore {
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut patterns = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (pattern, excludes) = line
                .strip_prefix('!')
                .map_or((line, true), |pattern| (pattern, false));
            ensure!(
                !pattern.contains(['[', '\\']),
                ".dockerignore: {line}: character classes and escapes are not read here"
            );
            let elements = pattern
                .split('/')
                .filter(|e| !e.is_empty() && *e != ".")
                .map(str::to_owned)
                .collect();
            patterns.push((elements, excludes));
        }
        Ok(Self { patterns })
    }

    /// Whether the context leaves out `path` (relative, `/`-separated).
    fn excludes(&self, path: &str) -> bool {
        let elements: Vec<&str> = path.split('/').collect();
        let mut excluded = false;
        for (pattern, excludes) in &self.patterns {
            if (1..=elements.len()).any(|n| matches(pattern, &elements[..n])) {
                excluded = *excludes;
            }
        }
        excluded
    }
}

/// Whether a pattern's elements match a path's.
fn matches(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => (0..=path.len()).any(|i| matches(rest, &path[i..])),
        Some((first, rest)) => path.split_first().is_some_and(|(element, others)| {
            element_matches(first.as_bytes(), element.as_bytes()) && matches(rest, others)
        }),
    }
}

/// `*` (any run of characters) and `?` (one character) within one path element.
fn element_matches(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| element_matches(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && element_matches(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && element_matches(rest, &name[1..]),
    }
}

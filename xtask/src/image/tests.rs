use super::*;

/// A Dockerfile that keeps the rules, on the toolchain "1.95.0".
const GOOD: &str = r#"# syntax=docker/dockerfile:1
# A comment.
FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY deploy/docker/build.sh deploy/docker/build.sh
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    # a comment inside the continuation
    sh deploy/docker/build.sh /out

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/switchyard /usr/local/bin/switchyard
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/switchyard"]
CMD ["serve", "--config", "/etc/switchyard/router.yaml"]
"#;

fn problem(dockerfile: &str) -> String {
    format!(
        "{:#}",
        check_dockerfile(dockerfile, "1.95.0").expect_err("the rules are broken")
    )
}

#[test]
fn the_real_dockerfile_keeps_the_rules_and_copies_the_build_script() {
    let root = crate::workspace_root();
    let stage = check(&root).expect("the Dockerfile keeps the image's rules");
    for copy in &stage.copies {
        for source in &copy.sources {
            assert!(root.join(source).exists(), "{source}");
        }
    }
}

#[test]
fn instructions_join_continuations_and_skip_comments() {
    let all = instructions(GOOD);
    assert_eq!(all.len(), 12);
    assert_eq!(
        all[5],
        Instruction {
            keyword: "RUN".into(),
            args:
                "--mount=type=cache,target=/usr/local/cargo/registry sh deploy/docker/build.sh /out"
                    .into()
        }
    );
}

#[test]
fn a_good_dockerfile_gives_its_build_stage() {
    let stage = check_dockerfile(GOOD, "1.95.0").expect("the rules are kept");
    assert_eq!(
        stage.copies,
        [
            Copy {
                sources: vec!["Cargo.toml".into(), "Cargo.lock".into()],
                destination: String::new(),
                into_directory: true,
            },
            Copy {
                sources: vec!["crates".into()],
                destination: "crates".into(),
                into_directory: false,
            },
            Copy {
                sources: vec![BUILD_SCRIPT.into()],
                destination: BUILD_SCRIPT.into(),
                into_directory: false,
            },
        ]
    );
}

#[test]
fn each_broken_rule_is_named() {
    let cases = [
        (
            "1.95.0-slim",
            "1.94.0-slim",
            "not the toolchain rust-toolchain.toml pins",
        ),
        ("cc-debian12", "cc-debian13", "not on bookworm"),
        (
            "USER 65532:65532",
            "USER 0",
            "a numeric user other than root",
        ),
        (
            "USER 65532:65532",
            "USER nonroot",
            "a numeric user other than root",
        ),
        ("USER 65532:65532\n", "", "sets no USER"),
        (
            r#"ENTRYPOINT ["/usr/local/bin/switchyard"]"#,
            "ENTRYPOINT /usr/local/bin/switchyard",
            "the exec form",
        ),
        (
            r#"ENTRYPOINT ["/usr/local/bin/switchyard"]"#,
            r#"ENTRYPOINT ["/bin/switchyard"]"#,
            "is not [\"/usr/local/bin/switchyard\"]",
        ),
        (
            "/out/switchyard /usr",
            "/target/switchyard /usr",
            "does not COPY --from=build /out",
        ),
        (
            "WORKDIR /src\n",
            "WORKDIR /src\nENV RUSTFLAGS=-Ctarget-cpu=native\n",
            "ENV in the build stage",
        ),
        (
            "sh deploy/docker/build.sh /out",
            "cargo build --release",
            "not `sh deploy/docker/build.sh",
        ),
        (
            "RUN --mount=type=cache,",
            "RUN --mount=type=bind,source=docs,target=/src/docs --mount=type=cache,",
            "not `sh deploy/docker/build.sh",
        ),
        ("\nRUN ", "\nWORKDIR /\nRUN ", "runs in WORKDIR /src"),
        (
            "COPY crates crates",
            "COPY ../crates crates",
            "not a plain path",
        ),
        ("COPY crates crates", "COPY crates /crates", "outside /src"),
        (
            "COPY deploy/docker/build.sh deploy/docker/build.sh\n",
            "",
            "does not copy deploy/docker/build.sh",
        ),
        ("EXPOSE 8000", "EXPOSE http", "TCP port numbers"),
        (
            "FROM gcr.io",
            "FROM debian:bookworm-slim AS x\nFROM gcr.io",
            "expected two stages",
        ),
    ];
    for (from, to, expected) in cases {
        assert!(GOOD.contains(from), "{from}");
        let broken = GOOD.replacen(from, to, 1);
        let problem = problem(&broken);
        assert!(problem.contains(expected), "{to}: {problem}");
    }
}

#[test]
fn the_toolchain_is_the_channel() {
    assert_eq!(
        toolchain("[toolchain]\nchannel = \"1.95.0\"\ncomponents = []\n").unwrap(),
        "1.95.0"
    );
    assert!(toolchain("[toolchain]\n").is_err());
}

#[test]
fn dockerignore_patterns_match_as_docker_matches_them() {
    let ignore = Ignore::parse(
        "# comment\n.git\n**/target\n/docs/\n*.html\n!keep.html\nfuzz*\ncrates/*/big?.bin\n",
    )
    .unwrap();
    for excluded in [
        ".git/HEAD",
        "target/debug/x",
        "crates/a/target/x",
        "docs/a.md",
        "report.html",
        "fuzz/Cargo.toml",
        "fuzzer",
        "crates/a/big1.bin",
    ] {
        assert!(ignore.excludes(excluded), "{excluded}");
    }
    for kept in [
        "keep.html",
        "crates/a/src/report.html",
        "crates/a/src/lib.rs",
        "crates/a/b/big1.bin",
        "crates/a/big12.bin",
        "mydocs/a.md",
        "Cargo.toml",
    ] {
        assert!(!ignore.excludes(kept), "{kept}");
    }
    assert!(Ignore::parse("[ab]c\n").is_err());
}

#[test]
fn a_copy_lays_out_what_dockerignore_leaves() {
    let dir = std::env::temp_dir().join(format!("xtask-image-{}", std::process::id()));
    let (root, context) = (dir.join("root"), dir.join("context"));
    for file in [
        "Cargo.toml",
        "crates/a/src/lib.rs",
        "crates/a/target/x",
        "notes/a.md",
    ] {
        let path = root.join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, file).unwrap();
    }
    let ignore = Ignore::parse("**/target\nnotes\n").unwrap();
    let stage = |args: &str| build_copy(args).unwrap();
    copy(&root, &stage("Cargo.toml ./"), &ignore, &context).unwrap();
    copy(&root, &stage("crates /src/crates"), &ignore, &context).unwrap();
    copy(&root, &stage("Cargo.toml renamed.toml"), &ignore, &context).unwrap();
    let mut laid: Vec<String> = files(&context, &context)
        .unwrap()
        .iter()
        .map(|f| f.strip_prefix(&context).unwrap().display().to_string())
        .collect();
    laid.sort();
    assert_eq!(laid, ["Cargo.toml", "crates/a/src/lib.rs", "renamed.toml"]);
    let ignored = copy(&root, &stage("notes notes"), &ignore, &context).unwrap_err();
    assert!(format!("{ignored}").contains("all of which .dockerignore leaves out"));
    let missing = copy(&root, &stage("nothing ./"), &ignore, &context).unwrap_err();
    assert!(format!("{missing}").contains("does not exist"));
    fs::remove_dir_all(&dir).unwrap();
}

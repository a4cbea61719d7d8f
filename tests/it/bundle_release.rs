//! The bundle is a release that runs on its own: it ships every file the repository tracks (the
//! list `SHIPPED` is kept equal to git's), and once built from this repository and extracted into
//! an empty folder, both crates' manifests load there (`cargo metadata --offline --no-deps`) and
//! every path the README's two commands, the scripts they call, the README's links and the
//! notebooks (`:dep` paths, files they read) need exists there, scripts executable. Building it
//! there is too slow for this suite: `scripts/test-bundle` runs the README's main command in an
//! extracted bundle.

use crate::common;

use common::bundle as b;
use common::{paquet_lab as pl, ROOT};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[test]
fn the_shipped_list_is_the_tracked_tree() {
    let shipped: BTreeSet<String> = iteragpu_lab::bundle::collect(Path::new(ROOT))
        .unwrap()
        .into_iter()
        .map(|m| m.path)
        .collect();
    let git = std::process::Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(ROOT)
        .output();
    let Some(listed) = git.ok().filter(|o| o.status.success()) else {
        eprintln!("not a git checkout: the shipped list is compared with nothing");
        return;
    };
    let tracked: BTreeSet<String> = listed
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8(p.to_vec()).unwrap())
        .filter(|p| Path::new(ROOT).join(p).exists())
        .collect();
    let unshipped: Vec<_> = tracked.difference(&shipped).collect();
    let untracked: Vec<_> = shipped.difference(&tracked).collect();
    assert!(
        unshipped.is_empty() && untracked.is_empty(),
        "tracked but not shipped (add them to bundle::SHIPPED): {unshipped:?}; shipped but not \
         tracked: {untracked:?}"
    );
}

#[test]
fn the_extracted_bundle_holds_what_its_commands_and_notebooks_need() {
    let dir = tempfile::tempdir().unwrap();
    let zip = dir.path().join("release.zip");
    pl().arg("build")
        .arg("--output")
        .arg(&zip)
        .assert()
        .success();
    let top = b::extract(&zip, &dir.path().join("empty"));
    pl().arg("verify").arg(&top).assert().success();

    // Both crates load from the extracted sources alone.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(top.join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut targets = BTreeSet::new();
    for package in metadata["packages"].as_array().unwrap() {
        for target in package["targets"].as_array().unwrap() {
            let name = |v: &serde_json::Value| v["name"].as_str().unwrap().to_owned();
            targets.insert(format!("{} {}", name(package), name(target)));
        }
    }
    for expected in [
        "iteragpu-lab iteragpu_lab",
        "iteragpu-lab mesure_memoire",
        "iteragpu-lab calcul_forfaits",
        "iteragpu-lab resultats_bruts",
        "iteragpu-lab paquet_lab",
        "iteragpu-lab build-script-build",
        "iteragpu-torch iteragpu_torch",
        "iteragpu-torch mesure_memoire_torch",
        "iteragpu-torch build-script-build",
    ] {
        assert!(targets.contains(expected), "{expected} not in {targets:?}");
    }
    for file in [
        "Cargo.lock",
        "torch/csrc/allocator_shim.cpp",
        "torch/csrc/allocator_shim.h",
    ] {
        assert!(top.join(file).is_file(), "{file}");
    }

    // The README's two commands and every script they call, sourced or run.
    let mut seen = BTreeSet::new();
    let mut pending = vec!["scripts/lab".to_string(), "scripts/test".to_string()];
    while let Some(script) = pending.pop() {
        if !seen.insert(script.clone()) {
            continue;
        }
        let path = top.join(&script);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("{script} missing"));
        if !script.ends_with(".sh") {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert!(mode & 0o111 != 0, "{script} is not executable");
        }
        pending.extend(scripts_called(&text));
    }
    for called in [
        "env.sh",
        "build",
        "jupyter",
        "kernel.sh",
        "test-notebooks",
        "run-notebooks.py",
        "build-notebook-programs",
        "notebook-program.py",
    ] {
        assert!(
            seen.contains(&format!("scripts/{called}")),
            "{called} not in {seen:?}"
        );
    }

    // The README's links.
    let readme = std::fs::read_to_string(top.join("README.md")).unwrap();
    for link in readme.split("](").skip(1) {
        let target = link.split(')').next().unwrap().split('#').next().unwrap();
        if !target.is_empty() && !target.contains("://") {
            assert!(top.join(target).exists(), "the README links {target}");
        }
    }

    // The notebooks: their `:dep` paths and the files they read, relative to notebooks/.
    let notebooks = top.join("notebooks");
    let (mut lab_deps, mut count) = (0, 0);
    for entry in std::fs::read_dir(&notebooks).unwrap().flatten() {
        count += 1;
        let nb: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.path()).unwrap()).unwrap();
        for cell in nb["cells"].as_array().unwrap() {
            let source: String = cell["source"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap())
                .collect();
            for line in source.lines().filter(|l| l.starts_with(":dep ")) {
                let path = quoted_after(line, "path = ").expect("a path dependency");
                assert!(notebooks.join(path).join("Cargo.toml").is_file(), "{line}");
                lab_deps += usize::from(line.starts_with(":dep iteragpu-lab "));
            }
            for quoted in source.split('"').skip(1).step_by(2) {
                if quoted.starts_with("../") && !quoted.ends_with('/') {
                    assert!(notebooks.join(quoted).exists(), "a notebook reads {quoted}");
                }
            }
        }
    }
    // Every notebook on the library (measurements go through the GPU companion).
    assert!(count >= 3, "{count} notebooks");
    assert_eq!(lab_deps, count, "one :dep iteragpu-lab line per notebook");
    assert!(notebooks
        .join("../data/exemple-mesure-h200-blocs.json")
        .is_file());
}

/// The scripts a shell script sources (`source .../NAME`) or runs (`scripts/NAME`).
fn scripts_called(text: &str) -> Vec<String> {
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut called = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(sourced) = line.strip_prefix("source ") {
            let name = sourced.trim_matches('"').rsplit('/').next().unwrap();
            called.push(format!("scripts/{name}"));
        }
        for (i, _) in line.match_indices("scripts/") {
            let rest = &line[i + "scripts/".len()..];
            let name: String = rest.chars().take_while(|&c| name_char(c)).collect();
            let name = name.trim_end_matches('.');
            if !name.is_empty() && !line.starts_with('#') {
                called.push(format!("scripts/{name}"));
            }
        }
    }
    called
}

/// The text between the quotes that follow `after` in `line`.
fn quoted_after<'l>(line: &'l str, after: &str) -> Option<&'l str> {
    let rest = &line[line.find(after)? + after.len()..];
    rest.strip_prefix('"')?.split('"').next()
}

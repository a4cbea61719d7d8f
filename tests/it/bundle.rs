//! The bundle through `paquet_lab build`, `verify` and `extract`: deterministic builds, names that
//! keep the zip and its members where they belong, a project read without following links or
//! blocking on pipes, notebooks refused with outputs in any shape, and verification of zips and
//! folders that detects every tampering with the content (altered byte, extra, missing,
//! traversal, absolute path, link, execute bit). The zip's form itself: `tests/bundle_form.rs`.

use crate::common;

use common::bundle::{self as b, Member, TOP};
use common::{mkfifo, paquet_lab as pl, DATA_ERROR, OUTPUT_EXISTS, PATIENCE, ROOT, USAGE};
use predicates::str::contains;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

fn verify_fails(target: &Path, what: &str) {
    pl().arg("verify")
        .arg(target)
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stdout(contains(what));
}

/// Sets every file's modification time below `dir` to `when`.
fn touch_all(dir: &Path, when: SystemTime) {
    for p in walk(dir).into_iter().filter(|p| p.is_file()) {
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
}

#[test]
fn two_builds_are_byte_identical_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let root = b::project(dir.path());
    let (a, c) = (dir.path().join("a.zip"), dir.path().join("c.zip"));
    b::build(&root, &a);
    // Times far apart (zip's resolution is 2 seconds) and a second process.
    touch_all(
        &root,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000),
    );
    b::build(&root, &c);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&c).unwrap());
    pl().arg("verify")
        .arg(&a)
        .assert()
        .success()
        .stdout(contains("every file matches"));
    let mut expected: Vec<String> = iteragpu_lab::bundle::collect(&root)
        .unwrap()
        .into_iter()
        .map(|m| format!("{TOP}/{}", m.path))
        .chain([format!("{TOP}/MANIFEST.json")])
        .collect();
    expected.sort();
    let members = b::members(&a);
    let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, expected);
    assert!(names.contains(&"iteragpu-lab-test/notebooks/essai.ipynb"));
    let lab = members.iter().find(|m| m.name.ends_with("/scripts/lab"));
    assert_eq!(
        lab.unwrap().mode,
        0o100755,
        "scripts keep their execute bit"
    );
    let readme = members.iter().find(|m| m.name.ends_with("/README.md"));
    assert_eq!(readme.unwrap().mode, 0o100644);
    // An existing output is never replaced.
    b::build_cmd(&root, &a).assert().code(OUTPUT_EXISTS);
}

#[test]
fn names_keep_the_zip_and_its_members_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let root = b::project(dir.path());
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    for bad in [
        "../x",
        "",
        "/tmp/iteragpu-bundle-x",
        "a/b",
        ".",
        "..",
        ".hidden",
    ] {
        pl().current_dir(&work)
            .args(["build", "--name", bad, "--root"])
            .arg(&root)
            .assert()
            .code(USAGE)
            .stderr(contains("--name"));
    }
    assert!(!dir.path().join("x.zip").exists());
    assert!(!Path::new("/tmp/iteragpu-bundle-x.zip").exists());
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    // Without --output, NAME.zip is written in the current folder, and only there.
    pl().current_dir(&work)
        .args(["build", "--root"])
        .arg(&root)
        .assert()
        .success();
    let written: Vec<_> = std::fs::read_dir(&work).unwrap().flatten().collect();
    assert_eq!(written.len(), 1);
    let name = written[0].file_name().into_string().unwrap();
    assert!(
        name.starts_with("iteragpu-lab-") && name.ends_with(".zip"),
        "{name}"
    );
}

#[test]
fn build_never_follows_links() {
    let dir = tempfile::tempdir().unwrap();
    let root = b::project(dir.path());
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "not for shipping").unwrap();
    std::fs::remove_file(root.join("README.md")).unwrap();
    std::os::unix::fs::symlink(&secret, root.join("README.md")).unwrap();
    let out = dir.path().join("x.zip");
    let refused = |what: &str| {
        b::build_cmd(&root, &out)
            .assert()
            .code(DATA_ERROR)
            .stderr(contains(what))
            .stderr(contains("symbolic link"));
        assert!(!out.exists());
    };
    refused("README.md");
    std::fs::remove_file(root.join("README.md")).unwrap();
    std::fs::copy(Path::new(ROOT).join("README.md"), root.join("README.md")).unwrap();
    // A link inside a shipped folder, to a folder.
    std::os::unix::fs::symlink(dir.path(), root.join("docs/elsewhere")).unwrap();
    refused("docs/elsewhere");
}

#[test]
fn build_refuses_named_pipes_and_missing_files_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let root = b::project(dir.path());
    let pipe = root.join("data/pipe");
    mkfifo(&pipe);
    let out = dir.path().join("x.zip");
    b::build_cmd(&root, &out)
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("data/pipe"))
        .stderr(contains("not a regular file"));
    std::fs::remove_file(&pipe).unwrap();
    std::fs::remove_file(root.join("Cargo.lock")).unwrap();
    b::build_cmd(&root, &out)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("Cargo.lock: missing"));
    assert!(!out.exists());
}

#[test]
fn notebooks_with_outputs_in_any_shape_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = b::project(dir.path());
    let out = dir.path().join("x.zip");
    let shapes = [
        b::NOTEBOOK.replace("\"execution_count\":null", "\"execution_count\":1"),
        b::NOTEBOOK.replace(
            "\"outputs\":[]",
            r#""outputs":[{"output_type":"stream","name":"stdout","text":["2"]}]"#,
        ),
        b::NOTEBOOK.replace(
            "\"outputs\":[]",
            r#""outputs":{"data":{"text/plain":"2"}}"#,
        ),
        r#"{"nbformat":3,"nbformat_minor":0,"metadata":{},"worksheets":[{"cells":[{"cell_type":"code","input":"1 + 1","outputs":[{"output_type":"pyout","text":"2"}]}]}]}"#.into(),
        b::NOTEBOOK.replace(
            "\"metadata\":{},\"nbformat\"",
            r#""metadata":{"widgets":{"application/vnd.jupyter.widget-state+json":{"state":{}}}},"nbformat""#,
        ),
    ];
    for notebook in shapes {
        std::fs::write(root.join("notebooks/essai.ipynb"), &notebook).unwrap();
        b::build_cmd(&root, &out)
            .assert()
            .code(DATA_ERROR)
            .stderr(contains("essai.ipynb is shipped with outputs"));
        assert!(!out.exists(), "refused: {notebook}");
    }
}

#[test]
fn tampered_zips_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.zip");
    b::build(&b::project(dir.path()), &good);
    let original = b::members(&good);
    // The zip as build lays it out, read back byte for byte: each variant below differs in
    // exactly one way.
    assert_eq!(
        b::raw_zip(&original, |_| true),
        std::fs::read(&good).unwrap()
    );
    let variant = |name: &str, edit: &dyn Fn(&mut Vec<Member>)| {
        let mut m = original.clone();
        edit(&mut m);
        let p = dir.path().join(name);
        b::rezip(&p, &m);
        p
    };
    let altered = variant("altered.zip", &|m| {
        b::member(m, "data/tarifs-forfaits.csv").bytes[100] ^= 1
    });
    verify_fails(&altered, "altered  data/tarifs-forfaits.csv");
    let extra = variant("extra.zip", &|m| {
        m.push(Member::file("iteragpu-lab-test/data/extra.txt", b"x"))
    });
    verify_fails(&extra, "extra    data/extra.txt");
    let missing = variant("missing.zip", &|m| {
        m.retain(|e| !e.name.ends_with("/data/tarifs-forfaits.csv"))
    });
    verify_fails(&missing, "missing  data/tarifs-forfaits.csv");
    let mode = variant("mode.zip", &|m| b::member(m, "README.md").mode = 0o100755);
    verify_fails(
        &mode,
        "altered  README.md: listed not executable, found executable",
    );
    let traversal = variant("traversal.zip", &|m| {
        m.push(Member::file("iteragpu-lab-test/../../evil.txt", b"x"))
    });
    verify_fails(&traversal, "rejected iteragpu-lab-test/../../evil.txt");
    let absolute = variant("absolute.zip", &|m| {
        m.push(Member::file("/tmp/evil.txt", b"x"))
    });
    verify_fails(&absolute, "rejected /tmp/evil.txt");
    let link = variant("link.zip", &|m| {
        let mut l = Member::file("iteragpu-lab-test/data/link", b"/etc/passwd");
        l.mode = 0o120777;
        m.push(l)
    });
    verify_fails(&link, "rejected iteragpu-lab-test/data/link: symbolic link");
    assert!(!dir.path().join("evil.txt").exists() && !Path::new("/tmp/evil.txt").exists());
}

#[test]
fn extracted_folders_are_verified_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let zip = dir.path().join("b.zip");
    b::build(&b::project(dir.path()), &zip);
    let out = dir.path().join("extracted");
    let top = b::extract(&zip, &out);
    assert_eq!(top, out.join(TOP));
    pl().arg("verify").arg(&out).assert().success();
    pl().arg("verify").arg(&top).assert().success();
    let listing = || {
        let mut v: Vec<_> = walk(&out);
        v.sort();
        v
    };
    let before = listing();
    let readme = top.join("README.md");
    let mut bytes = std::fs::read(&readme).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&readme, bytes).unwrap();
    verify_fails(&top, "altered  README.md");
    std::fs::remove_file(top.join("LICENSE.txt")).unwrap();
    verify_fails(&top, "missing  LICENSE.txt");
    std::fs::write(top.join("notes.txt"), "x").unwrap();
    verify_fails(&top, "extra    notes.txt");
    std::fs::create_dir(top.join("empty")).unwrap();
    verify_fails(&top, "extra    empty/");
    std::os::unix::fs::symlink("/etc/passwd", top.join("data/link")).unwrap();
    verify_fails(&top, "rejected data/link: symbolic link");
    mkfifo(&top.join("data/pipe"));
    verify_fails(&top, "rejected data/pipe: not a regular file");
    let after = listing();
    assert_eq!(
        after.len(),
        before.len() + 3,
        "verify wrote nothing: {after:?}"
    );
}

#[test]
fn extraction_needs_a_verified_zip_and_a_free_name() {
    let dir = tempfile::tempdir().unwrap();
    let zip = dir.path().join("b.zip");
    b::build(&b::project(dir.path()), &zip);
    let into = dir.path().join("into");
    let top = b::extract(&zip, &into);
    let lab = std::fs::metadata(top.join("scripts/lab")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&lab.permissions()) & 0o777,
        0o755
    );
    // An existing folder is neither replaced nor merged into.
    std::fs::write(top.join("mine.txt"), "kept").unwrap();
    pl().arg("extract")
        .arg(&zip)
        .arg("--into")
        .arg(&into)
        .assert()
        .code(OUTPUT_EXISTS);
    assert_eq!(
        std::fs::read_to_string(top.join("mine.txt")).unwrap(),
        "kept"
    );
    // A tampered zip writes nothing.
    let mut m = b::members(&zip);
    b::member(&mut m, "README.md").bytes[0] ^= 1;
    let bad = dir.path().join("bad.zip");
    b::rezip(&bad, &m);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    pl().arg("extract")
        .arg(&bad)
        .arg("--into")
        .arg(&empty)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("nothing extracted"))
        .stderr(contains("altered  README.md"));
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.push(p.clone());
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

//! The bundle through `paquet_lab`: deterministic builds, verification of zips and folders, and
//! every tampering detected (altered byte, extra, missing, traversal, absolute path, link).

mod common;

use common::{paquet_lab as pl, DATA_ERROR, OUTPUT_EXISTS, ROOT};
use predicates::str::contains;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
const NOTEBOOK: &str = r#"{"cells":[{"cell_type":"code","execution_count":null,"metadata":{},"outputs":[],"source":["1 + 1"]}],"metadata":{},"nbformat":4,"nbformat_minor":5}"#;

/// A project tree with the shipped files and one stripped notebook.
fn project(dir: &Path) -> PathBuf {
    let root = dir.join("project");
    for rel in iteragpu_lab::bundle::CONTENT {
        let dest = root.join(rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(Path::new(ROOT).join(rel), dest).unwrap();
    }
    std::fs::create_dir_all(root.join("notebooks")).unwrap();
    std::fs::write(root.join("notebooks/essai.ipynb"), NOTEBOOK).unwrap();
    root
}

fn build(root: &Path, output: &Path) {
    pl().args(["build", "--name", "iteragpu-lab-test", "--root"])
        .arg(root)
        .arg("--output")
        .arg(output)
        .assert()
        .success();
}

/// A zip member: name, bytes, unix mode.
type Member = (String, Vec<u8>, Option<u32>);

fn members(zip: &Path) -> Vec<Member> {
    let mut z = zip::ZipArchive::new(std::fs::File::open(zip).unwrap()).unwrap();
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).unwrap();
            let mut b = Vec::new();
            e.read_to_end(&mut b).unwrap();
            (e.name().to_string(), b, e.unix_mode())
        })
        .collect()
}

fn rezip(path: &Path, entries: &[Member]) {
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    for (name, bytes, mode) in entries {
        let o = zip::write::SimpleFileOptions::default().unix_permissions(mode.unwrap_or(0o644));
        if mode.is_some_and(|m| m & 0o170000 == 0o120000) {
            z.add_symlink(name, String::from_utf8_lossy(bytes), o)
                .unwrap();
        } else {
            z.start_file(name, o).unwrap();
            z.write_all(bytes).unwrap();
        }
    }
    z.finish().unwrap();
}

fn verify_fails(target: &Path, what: &str) {
    pl().arg("verify")
        .arg(target)
        .assert()
        .code(DATA_ERROR)
        .stdout(contains(what));
}

#[test]
fn two_builds_are_byte_identical_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let root = project(dir.path());
    let (a, b) = (dir.path().join("a.zip"), dir.path().join("b.zip"));
    build(&root, &a);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    build(&root, &b);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    pl().arg("verify")
        .arg(&a)
        .assert()
        .success()
        .stdout(contains("every file matches"));
    let names: Vec<String> = members(&a).into_iter().map(|m| m.0).collect();
    assert_eq!(
        names,
        [
            "iteragpu-lab-test/LICENSE.txt",
            "iteragpu-lab-test/MANIFEST.json",
            "iteragpu-lab-test/README.md",
            "iteragpu-lab-test/data/protocole-qualite.md",
            "iteragpu-lab-test/data/resultats-bruts.csv",
            "iteragpu-lab-test/data/tarifs-forfaits.csv",
            "iteragpu-lab-test/notebooks/essai.ipynb",
        ]
    );
    // An existing output is never replaced.
    pl().args(["build", "--root"])
        .arg(&root)
        .arg("--output")
        .arg(&a)
        .assert()
        .code(OUTPUT_EXISTS);
}

#[test]
fn notebooks_with_outputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = project(dir.path());
    std::fs::write(
        root.join("notebooks/essai.ipynb"),
        NOTEBOOK.replace("\"execution_count\":null", "\"execution_count\":1"),
    )
    .unwrap();
    let out = dir.path().join("x.zip");
    pl().args(["build", "--root"])
        .arg(&root)
        .arg("--output")
        .arg(&out)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("essai.ipynb is shipped with outputs"));
    assert!(!out.exists());
}

#[test]
fn tampered_zips_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.zip");
    build(&project(dir.path()), &good);
    let original = members(&good);
    let variant = |name: &str, edit: &dyn Fn(&mut Vec<Member>)| {
        let mut m = original.clone();
        edit(&mut m);
        let p = dir.path().join(name);
        rezip(&p, &m);
        p
    };
    let csv = "iteragpu-lab-test/data/tarifs-forfaits.csv";
    let altered = variant("altered.zip", &|m| {
        let e = m.iter_mut().find(|e| e.0 == csv).unwrap();
        e.1[100] ^= 1;
    });
    verify_fails(&altered, "altered  data/tarifs-forfaits.csv");
    let extra = variant("extra.zip", &|m| {
        m.push((
            "iteragpu-lab-test/data/extra.txt".into(),
            b"x".to_vec(),
            None,
        ))
    });
    verify_fails(&extra, "extra    data/extra.txt");
    let missing = variant("missing.zip", &|m| m.retain(|e| e.0 != csv));
    verify_fails(&missing, "missing  data/tarifs-forfaits.csv");
    let traversal = variant("traversal.zip", &|m| {
        m.push((
            "iteragpu-lab-test/../../evil.txt".into(),
            b"x".to_vec(),
            None,
        ))
    });
    verify_fails(&traversal, "rejected iteragpu-lab-test/../../evil.txt");
    let absolute = variant("absolute.zip", &|m| {
        m.push(("/tmp/evil.txt".into(), b"x".to_vec(), None))
    });
    verify_fails(&absolute, "rejected /tmp/evil.txt");
    let link = variant("link.zip", &|m| {
        m.push((
            "iteragpu-lab-test/data/link".into(),
            b"/etc/passwd".to_vec(),
            Some(0o120777),
        ))
    });
    verify_fails(&link, "rejected iteragpu-lab-test/data/link: symbolic link");
    assert!(!dir.path().join("evil.txt").exists() && !Path::new("/tmp/evil.txt").exists());
}

#[test]
fn extracted_folders_are_verified_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let zip = dir.path().join("b.zip");
    build(&project(dir.path()), &zip);
    let out = dir.path().join("extracted");
    for (name, bytes, _) in members(&zip) {
        let p = out.join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    pl().arg("verify").arg(&out).assert().success();
    let top = out.join("iteragpu-lab-test");
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
    std::os::unix::fs::symlink("/etc/passwd", top.join("data/link")).unwrap();
    verify_fails(&top, "rejected data/link: symbolic link");
    let after = listing();
    assert_eq!(
        after.len(),
        before.len() + 1,
        "verify wrote nothing: {after:?}"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

//! `paquet_lab verify` accepts a zip only in the one form `build` writes, and reads any zip in
//! bounded memory and time: names used twice, local entries the central directory leaves out,
//! bytes before or after the archive, headers other than build's, a manifest that lists a file
//! twice or whose own fields differ from build's, a compressed member (a zip bomb among them),
//! a file too large or a named pipe given as the zip are all refused, naming the member or file,
//! with exit 65.

use crate::common;

use common::bundle::{self as b, Member, TOP};
use common::{mkfifo, paquet_lab as pl, DATA_ERROR, PATIENCE};
use predicates::str::contains;
use std::path::{Path, PathBuf};

/// A built zip in a temporary folder, and its members.
fn built() -> (tempfile::TempDir, PathBuf, Vec<Member>) {
    let dir = tempfile::tempdir().unwrap();
    let zip = dir.path().join("good.zip");
    b::build(&b::project(dir.path()), &zip);
    let members = b::members(&zip);
    (dir, zip, members)
}

/// `verify` refuses `bytes` with exit 65, and its error says `what`.
fn refused(dir: &Path, file: &str, bytes: &[u8], what: &[&str]) {
    let path = dir.join(file);
    std::fs::write(&path, bytes).unwrap();
    let mut assert = pl()
        .arg("verify")
        .arg(&path)
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains(file));
    for w in what {
        assert = assert.stderr(contains(*w));
    }
}

#[test]
fn a_name_used_twice_is_refused() {
    let (dir, _, members) = built();
    let mut tampered = members.clone();
    let readme = b::member(&mut tampered, "README.md");
    readme.bytes = b"# A README that says something else\n".to_vec();
    let readme = readme.clone();
    // The tampered member first (what an extractor that keeps the first one writes), then all.
    let twice: Vec<Member> = [readme].into_iter().chain(members).collect();
    refused(
        dir.path(),
        "twice.zip",
        &b::raw_zip(&twice, |_| true),
        &["iteragpu-lab-test/README.md: two members carry this name"],
    );
}

#[test]
fn a_local_entry_absent_from_the_central_directory_is_refused() {
    let (dir, _, mut members) = built();
    members.push(Member::file(
        "iteragpu-lab-test/data/hidden.txt",
        b"read by a streaming extractor",
    ));
    let last = members.len() - 1;
    refused(
        dir.path(),
        "hidden.zip",
        &b::raw_zip(&members, |i| i != last),
        &["iteragpu-lab-test/data/hidden.txt: local entry absent from the central directory"],
    );
}

#[test]
fn bytes_before_or_after_the_archive_are_refused() {
    let (dir, zip, _) = built();
    let good = std::fs::read(&zip).unwrap();
    let before = [b"#!/bin/sh\nexit 0\n".as_slice(), &good].concat();
    refused(
        dir.path(),
        "before.zip",
        &before,
        &["bytes before the archive"],
    );
    let after = [&good, b"trailing".as_slice()].concat();
    refused(
        dir.path(),
        "after.zip",
        &after,
        &["8 bytes after the end of the archive"],
    );
    let mut comment = good.clone();
    let n = comment.len();
    comment[n - 2..].copy_from_slice(&4u16.to_le_bytes());
    comment.extend(b"note");
    refused(dir.path(), "comment.zip", &comment, &["comment"]);
    refused(dir.path(), "text.zip", b"not a zip at all", &["not a zip"]);
}

#[test]
fn the_manifest_must_say_exactly_what_build_says() {
    let (dir, _, members) = built();
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut m = members.clone();
        let mut manifest = b::manifest_of(&mut m);
        edit(&mut manifest);
        b::set_manifest(&mut m, &manifest);
        b::raw_zip(&m, |_| true)
    };
    let readme_at = |v: &serde_json::Value| {
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .position(|f| f["path"] == "README.md")
            .unwrap()
    };
    let twice = with(&|v| {
        let i = readme_at(v);
        let entry = v["files"][i].clone();
        v["files"].as_array_mut().unwrap().insert(i + 1, entry);
    });
    refused(
        dir.path(),
        "twice.zip",
        &twice,
        &["MANIFEST.json", "lists README.md twice"],
    );
    let schema = with(&|v| v["schema"] = "iteragpu-lab/manifest/v1".into());
    refused(
        dir.path(),
        "schema.zip",
        &schema,
        &["MANIFEST.json", "schema"],
    );
    let name = with(&|v| v["name"] = "another-name".into());
    refused(
        dir.path(),
        "name.zip",
        &name,
        &["names the bundle `another-name`"],
    );
    let note = with(&|v| v["note"] = "All good.".into());
    refused(dir.path(), "note.zip", &note, &["MANIFEST.json", "note"]);
    let hashed_self = with(&|v| {
        let last = v["files"].as_array().unwrap().len() - 1;
        v["files"][last]["sha256"] = "0".repeat(64).into();
    });
    refused(
        dir.path(),
        "self.zip",
        &hashed_self,
        &["MANIFEST.json", "without size or hash"],
    );
    let no_self = with(&|v| drop(v["files"].as_array_mut().unwrap().pop()));
    refused(
        dir.path(),
        "noself.zip",
        &no_self,
        &["does not list itself last"],
    );
    let unknown = with(&|v| v["signed_by"] = "someone".into());
    refused(
        dir.path(),
        "unknown.zip",
        &unknown,
        &["unknown field `signed_by`"],
    );
    let mut m = members.clone();
    let manifest = b::manifest_of(&mut m);
    b::member(&mut m, "MANIFEST.json").bytes = serde_json::to_vec(&manifest).unwrap();
    refused(
        dir.path(),
        "compact.zip",
        &b::raw_zip(&m, |_| true),
        &["MANIFEST.json", "one form build writes"],
    );
}

#[test]
fn headers_other_than_builds_are_refused() {
    let (dir, _, members) = built();
    let rewrite = |options: zip::write::SimpleFileOptions| {
        let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for m in &members {
            z.start_file(&m.name, options.unix_permissions(m.mode & 0o777))
                .unwrap();
            std::io::Write::write_all(&mut z, &m.bytes).unwrap();
        }
        z.finish().unwrap().into_inner()
    };
    let deflated = rewrite(zip::write::SimpleFileOptions::default());
    refused(
        dir.path(),
        "deflated.zip",
        &deflated,
        &["compressed (method 8)"],
    );
    let time = zip::DateTime::from_date_and_time(2020, 2, 2, 12, 0, 0).unwrap();
    let dated = rewrite(
        zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(time),
    );
    refused(
        dir.path(),
        "dated.zip",
        &dated,
        &[&format!(
            "{TOP}/.ci/run: the archive differs from the one form build writes"
        )],
    );
    let mut reversed = members.clone();
    reversed.reverse();
    refused(
        dir.path(),
        "order.zip",
        &b::raw_zip(&reversed, |_| true),
        &["differs from the one form build writes"],
    );
}

/// A zip whose one member is `size` bytes of zeros, deflated into about a thousandth of that.
fn zip_bomb(name: &str, size: u32) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let mib = vec![0u8; 1 << 20];
    let mut deflate = Compress::new(Compression::best(), false);
    let mut squeeze = |input: &[u8], flush| {
        let before = deflate.total_in();
        let mut out = Vec::with_capacity(1 << 16);
        deflate.compress_vec(input, &mut out, flush).unwrap();
        assert_eq!(deflate.total_in() - before, input.len() as u64);
        out
    };
    // Every mebibyte after the first compresses to the same blocks, ending on a byte boundary.
    let first = squeeze(&mib, FlushCompress::Sync);
    let next = squeeze(&mib, FlushCompress::Sync);
    let mut data = first;
    for _ in 1..size >> 20 {
        data.extend(&next);
    }
    data.extend(squeeze(&[], FlushCompress::Finish));
    let header = |out: &mut Vec<u8>| {
        for v in [20u16, 0, 8, 0, 0x21] {
            out.extend(v.to_le_bytes()); // version, flags, method: deflate, time, date
        }
        out.extend(0u32.to_le_bytes()); // checksum: never reached
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(size.to_le_bytes());
        out.extend((name.len() as u16).to_le_bytes());
        out.extend(0u16.to_le_bytes());
    };
    let mut zip = 0x0403_4b50u32.to_le_bytes().to_vec();
    header(&mut zip);
    zip.extend(name.as_bytes());
    zip.extend(&data);
    let directory_at = zip.len() as u32;
    zip.extend(0x0201_4b50u32.to_le_bytes());
    zip.extend(0x0314u16.to_le_bytes());
    header(&mut zip);
    zip.extend([0; 10]); // comment length, disk, internal and external attributes
    zip.extend(0u32.to_le_bytes()); // the local entry's offset
    zip.extend(name.as_bytes());
    let directory_len = zip.len() as u32 - directory_at;
    zip.extend(0x0605_4b50u32.to_le_bytes());
    zip.extend([0, 0, 0, 0, 1, 0, 1, 0]);
    zip.extend(directory_len.to_le_bytes());
    zip.extend(directory_at.to_le_bytes());
    zip.extend(0u16.to_le_bytes());
    zip
}

#[test]
fn a_zip_bomb_is_refused_in_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    // 1 GiB of zeros in about 1 MiB; verify runs with 256 MiB of address space.
    let bomb = zip_bomb(&format!("{TOP}/data/zeros.bin"), 1 << 30);
    assert!(bomb.len() < 4 << 20, "{} bytes", bomb.len());
    let path = dir.path().join("bomb.zip");
    std::fs::write(&path, bomb).unwrap();
    let program = assert_cmd::cargo::cargo_bin("paquet_lab");
    assert_cmd::Command::new("bash")
        .arg("-c")
        .arg(r#"ulimit -v 262144 && exec "$0" verify "$1""#)
        .arg(program)
        .arg(&path)
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("bomb.zip"))
        .stderr(contains(format!("{TOP}/data/zeros.bin: compressed")))
        .stderr(contains("nothing is inflated"));
}

#[test]
fn a_zip_too_large_or_not_a_file_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let large = dir.path().join("large.zip");
    std::fs::File::create(&large)
        .unwrap()
        .set_len(iteragpu_lab::bundle::MAX_ARCHIVE_BYTES + 1)
        .unwrap();
    pl().arg("verify")
        .arg(&large)
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("large.zip: larger than"));
    let pipe = dir.path().join("pipe.zip");
    mkfifo(&pipe);
    pl().arg("verify")
        .arg(&pipe)
        .timeout(PATIENCE)
        .assert()
        .code(DATA_ERROR)
        .stderr(contains("pipe.zip: not a regular file"));
}

#[test]
fn the_command_reference_states_the_limits_verify_applies() {
    use iteragpu_lab::bundle::{MAX_ARCHIVE_BYTES, MAX_CONTENT_BYTES, MAX_FILES, MAX_FILE_BYTES};
    let readme = std::fs::read_to_string(Path::new(common::ROOT).join("docs/cli.md"))
        .unwrap()
        .replace('\n', " ");
    for stated in [
        format!("a zip larger than {} MiB", MAX_ARCHIVE_BYTES >> 20),
        format!("a file larger than {} MiB", MAX_FILE_BYTES >> 20),
        format!("more than {} MiB in all", MAX_CONTENT_BYTES >> 20),
        format!("more than {MAX_FILES} files"),
    ] {
        assert!(readme.contains(&stated), "docs/cli.md lacks `{stated}`");
    }
}

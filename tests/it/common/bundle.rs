//! What the bundle tests share: a project tree to build from, builds and extractions through
//! `paquet_lab`, reading a zip's members, and a raw zip writer that lays members out exactly as
//! `build` does, so that a test can tamper with one thing at a time (a name used twice, a local
//! entry the central directory leaves out) and nothing else.

use super::{paquet_lab, ROOT};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The top folder of the test builds.
pub const TOP: &str = "iteragpu-lab-test";

/// A stripped notebook added to the test project.
pub const NOTEBOOK: &str = r#"{"cells":[{"cell_type":"code","execution_count":null,"metadata":{},"outputs":[],"source":["1 + 1"]}],"metadata":{},"nbformat":4,"nbformat_minor":5}"#;

/// A copy of every file the repository ships, with its execute bit, plus one stripped notebook
/// `notebooks/essai.ipynb`, in `dir/project`.
pub fn project(dir: &Path) -> PathBuf {
    let root = dir.join("project");
    for m in iteragpu_lab::bundle::collect(Path::new(ROOT)).unwrap() {
        let dest = root.join(&m.path);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(&dest, &m.bytes).unwrap();
        let mode = if m.executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::write(root.join("notebooks/essai.ipynb"), NOTEBOOK).unwrap();
    root
}

/// `paquet_lab build --root ROOT --output OUTPUT`, to run.
pub fn build_cmd(root: &Path, output: &Path) -> assert_cmd::Command {
    let mut c = paquet_lab();
    c.args(["build", "--root"])
        .arg(root)
        .arg("--output")
        .arg(output);
    c
}

/// `paquet_lab build --root ROOT --output OUTPUT --name TOP`, which must succeed.
pub fn build(root: &Path, output: &Path) {
    build_cmd(root, output)
        .args(["--name", TOP])
        .assert()
        .success();
}

/// `paquet_lab extract ZIP --into INTO`, which must succeed; the extracted top folder.
pub fn extract(zip: &Path, into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    paquet_lab()
        .arg("extract")
        .arg(zip)
        .arg("--into")
        .arg(into)
        .assert()
        .success();
    let mut entries: Vec<_> = std::fs::read_dir(into).unwrap().flatten().collect();
    assert_eq!(entries.len(), 1, "one top folder");
    entries.pop().unwrap().path()
}

/// A zip member: full name, bytes, Unix mode (file type bits included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub bytes: Vec<u8>,
    pub mode: u32,
}

impl Member {
    /// A regular file with mode 0644.
    pub fn file(name: &str, bytes: &[u8]) -> Member {
        Member {
            name: name.into(),
            bytes: bytes.to_vec(),
            mode: 0o100644,
        }
    }
}

/// The members of a zip, read with the `zip` crate.
pub fn members(zip: &Path) -> Vec<Member> {
    let mut z = zip::ZipArchive::new(std::fs::File::open(zip).unwrap()).unwrap();
    (0..z.len())
        .map(|i| {
            let mut e = z.by_index(i).unwrap();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            Member {
                name: e.name().to_string(),
                bytes,
                mode: e.unix_mode().unwrap(),
            }
        })
        .collect()
}

/// The member named `TOP/rel`.
pub fn member<'m>(members: &'m mut [Member], rel: &str) -> &'m mut Member {
    let name = format!("{TOP}/{rel}");
    members.iter_mut().find(|m| m.name == name).unwrap()
}

/// CRC-32 (IEEE), as zip headers carry it.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A zip laid out as `build` lays it out (stored members, version 1.0, time 1980-01-01, Unix
/// attributes), in the order given; the central directory lists only the members whose index
/// `listed` accepts.
pub fn raw_zip(members: &[Member], listed: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offsets = Vec::new();
    let fixed = |out: &mut Vec<u8>, m: &Member| {
        for v in [10u16, 0, 0, 0, 0x21] {
            out.extend(v.to_le_bytes()); // version needed, flags, method, time, date
        }
        out.extend(crc32(&m.bytes).to_le_bytes());
        out.extend((m.bytes.len() as u32).to_le_bytes());
        out.extend((m.bytes.len() as u32).to_le_bytes());
        out.extend((m.name.len() as u16).to_le_bytes());
        out.extend(0u16.to_le_bytes()); // extra field length
    };
    for m in members {
        offsets.push(out.len() as u32);
        out.extend(0x0403_4b50u32.to_le_bytes());
        fixed(&mut out, m);
        out.extend(m.name.as_bytes());
        out.extend(&m.bytes);
    }
    let directory_at = out.len() as u32;
    let mut count = 0u16;
    for (i, m) in members.iter().enumerate().filter(|(i, _)| listed(*i)) {
        count += 1;
        out.extend(0x0201_4b50u32.to_le_bytes());
        out.extend(0x030au16.to_le_bytes()); // made by: Unix, 1.0
        fixed(&mut out, m);
        for v in [0u16, 0, 0] {
            out.extend(v.to_le_bytes()); // comment length, disk, internal attributes
        }
        out.extend((m.mode << 16).to_le_bytes());
        out.extend(offsets[i].to_le_bytes());
        out.extend(m.name.as_bytes());
    }
    let directory_len = out.len() as u32 - directory_at;
    out.extend(0x0605_4b50u32.to_le_bytes());
    for v in [0u16, 0, count, count] {
        out.extend(v.to_le_bytes());
    }
    out.extend(directory_len.to_le_bytes());
    out.extend(directory_at.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// Writes `members` as [`raw_zip`] lists them all, into `path`.
pub fn rezip(path: &Path, members: &[Member]) {
    std::fs::write(path, raw_zip(members, |_| true)).unwrap();
}

/// The manifest of a zip's members, as JSON.
pub fn manifest_of(members: &mut [Member]) -> serde_json::Value {
    serde_json::from_slice(&member(members, "MANIFEST.json").bytes).unwrap()
}

/// Replaces the manifest among `members` by `manifest`, written as `build` writes it.
pub fn set_manifest(members: &mut [Member], manifest: &serde_json::Value) {
    let mut bytes = serde_json::to_vec_pretty(manifest).unwrap();
    bytes.push(b'\n');
    member(members, "MANIFEST.json").bytes = bytes;
}

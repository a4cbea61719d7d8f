//! The bundle's zip in its one canonical form, and a strict reader of that form.
//!
//! [`write()`] stores every member uncompressed, in path order, with a fixed time (1980-01-01) and
//! mode 0644 or 0755, no folder entries, no extra fields and no comment: the bytes depend on the
//! files alone, and no member can expand beyond the archive's own size (a "zip bomb" is refused
//! as compressed before anything is inflated).
//!
//! [`read`] walks the archive from its first byte to its last as `build` lays it out: local
//! entries back to back from byte 0, then the central directory listing each of them once, in the
//! same order and with the same fields, then the end record, ending the file. Bytes before, between
//! or after, a local entry the central directory does not list, a name used twice, a compressed,
//! encrypted or streamed member are refused with the member or byte they concern. What this walk
//! does not look at (version fields, times, attributes, a member's checksum) is compared later by
//! writing the canonical archive again and comparing bytes (see `verify`). Not the `zip` crate's
//! reader: it finds an archive from its end record and trusts the central directory, so it takes
//! bytes before the archive and local entries the directory leaves out without a word, where this
//! walk names the member or byte at fault; `zip` writes the archive.

use std::io::Write;

/// The mode of a file that is not executable.
pub const FILE_MODE: u32 = 0o644;
/// The mode of an executable file.
pub const EXEC_MODE: u32 = 0o755;

const LOCAL: u32 = 0x0403_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const END: u32 = 0x0605_4b50;
const LOCAL_LEN: usize = 30;
const CENTRAL_LEN: usize = 46;
const END_LEN: usize = 22;

/// A member to write: its full name in the zip, its bytes, whether it is executable.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// Its path under the archive's top folder.
    pub path: &'a str,
    /// The content.
    pub bytes: &'a [u8],
    /// Mode 0755 if true, 0644 otherwise.
    pub executable: bool,
}

/// A member's mode: [`EXEC_MODE`] if `executable`, else [`FILE_MODE`].
pub fn mode(executable: bool) -> u32 {
    if executable {
        EXEC_MODE
    } else {
        FILE_MODE
    }
}

/// The canonical zip of `entries` under the top folder `top`, sorted here by name.
pub fn write(top: &str, entries: &[Entry]) -> Vec<u8> {
    let mut sorted = entries.to_vec();
    sorted.sort_by(|a, b| a.path.cmp(b.path));
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for entry in sorted {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(mode(entry.executable));
        zip.start_file(format!("{top}/{}", entry.path), options)
            .expect("writing to memory");
        zip.write_all(entry.bytes).expect("writing to memory");
    }
    zip.finish().expect("writing to memory").into_inner()
}

/// A member found by [`read`].
#[derive(Debug, Clone)]
pub struct Found<'a> {
    /// The member's full name.
    pub name: String,
    /// Its bytes, inside the archive's.
    pub bytes: &'a [u8],
    /// Where its bytes start in the archive.
    pub data_at: usize,
    /// Its Unix mode, file type bits included, from the central directory.
    pub mode: u32,
    /// Where its local entry starts in the archive.
    pub local_at: usize,
    /// Where its central directory entry starts in the archive.
    pub central_at: usize,
}

impl Found<'_> {
    /// Whether the member is a symbolic link.
    pub fn is_link(&self) -> bool {
        self.mode & 0o170000 == 0o120000
    }
}

/// A little-endian reader over the archive that names what ran short.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u16(&self, at: usize) -> Result<u16, String> {
        self.slice(at, 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, at: usize) -> Result<u32, String> {
        self.slice(at, 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn slice(&self, at: usize, len: usize) -> Result<&'a [u8], String> {
        at.checked_add(len)
            .and_then(|end| self.bytes.get(at..end))
            .ok_or_else(|| format!("truncated at byte {at}"))
    }

    fn signature_at(&self, at: usize) -> Option<u32> {
        self.u32(at).ok()
    }
}

/// One local entry's fields that the central directory must repeat.
#[derive(Debug, PartialEq, Eq)]
struct Header {
    flags: u16,
    method: u16,
    crc: u32,
    compressed: u32,
    size: u32,
    name: Vec<u8>,
}

impl Header {
    /// Reads a header whose `flags` lie at `fields` (a local entry's at +6, a central one's at
    /// +8: the other fields follow in the same layout in both) and whose name starts at `name_at`.
    fn read(c: &Cursor, fields: usize, name_at: usize) -> Result<Header, String> {
        Ok(Header {
            flags: c.u16(fields)?,
            method: c.u16(fields + 2)?,
            crc: c.u32(fields + 8)?,
            compressed: c.u32(fields + 12)?,
            size: c.u32(fields + 16)?,
            name: c.slice(name_at, c.u16(fields + 20)?.into())?.to_vec(),
        })
    }
}

/// A local entry: where it starts, its header, its name and its data.
struct Local<'a> {
    at: usize,
    header: Header,
    name: String,
    data_at: usize,
    data: &'a [u8],
}

/// The members of a canonical archive, in order, or what keeps `bytes` from being one (naming
/// the member or the byte). `max_member` caps each member's size, `max_members` their number.
pub fn read(bytes: &[u8], max_member: u64, max_members: usize) -> Result<Vec<Found<'_>>, String> {
    let c = Cursor { bytes };
    if c.signature_at(0) != Some(LOCAL) {
        return Err(
            "does not begin with a zip member at byte 0 (not a zip, or bytes before \
                    the archive)"
                .into(),
        );
    }
    let locals = read_locals(&c, max_member, max_members)?;
    let directory_at = locals.last().map_or(0, |l| l.data_at + l.data.len());
    let (members, end_at) = read_directory(&c, directory_at, &locals)?;
    check_end(&c, end_at, directory_at, members.len())?;
    let mut names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!(
            "{}: two members carry this name (an extractor would keep either)",
            shown(twice[0])
        ));
    }
    Ok(members)
}

/// The local entries, back to back from byte 0.
fn read_locals<'a>(
    c: &Cursor<'a>,
    max_member: u64,
    max_members: usize,
) -> Result<Vec<Local<'a>>, String> {
    let mut locals = Vec::new();
    let mut at = 0;
    while c.signature_at(at) == Some(LOCAL) {
        if locals.len() == max_members {
            return Err(format!("more than {max_members} members"));
        }
        let header = Header::read(c, at + 6, at + LOCAL_LEN)?;
        let name = String::from_utf8(header.name.clone())
            .map_err(|_| format!("byte {at}: a member whose name is not UTF-8"))?;
        check_member(&header, &name, max_member)?;
        let data_at = at + LOCAL_LEN + header.name.len() + usize::from(c.u16(at + 28)?);
        let data = c
            .slice(data_at, header.size as usize)
            .map_err(|e| format!("{}: {e}", shown(&name)))?;
        locals.push(Local {
            at,
            header,
            name,
            data_at,
            data,
        });
        at = data_at + data.len();
    }
    Ok(locals)
}

/// The central directory from `at`: one entry per local entry, in the same order, repeating its
/// fields and pointing at it. Returns the members and where the directory ends.
fn read_directory<'a>(
    c: &Cursor<'a>,
    mut at: usize,
    locals: &[Local<'a>],
) -> Result<(Vec<Found<'a>>, usize), String> {
    let mut members = Vec::with_capacity(locals.len());
    while c.signature_at(at) == Some(CENTRAL) {
        let name_len = usize::from(c.u16(at + 28)?);
        let header = Header::read(c, at + 8, at + CENTRAL_LEN)?;
        let Some(local) = locals.get(members.len()) else {
            return Err(format!(
                "{}: listed in the central directory with no local entry",
                shown(&String::from_utf8_lossy(&header.name))
            ));
        };
        if header != local.header || c.u32(at + 42)? as usize != local.at {
            return Err(format!(
                "{}: its central directory entry does not match its local entry (or lists \
                 another member at its place)",
                shown(&local.name)
            ));
        }
        members.push(Found {
            name: local.name.clone(),
            bytes: local.data,
            data_at: local.data_at,
            mode: c.u32(at + 38)? >> 16,
            local_at: local.at,
            central_at: at,
        });
        at += CENTRAL_LEN + name_len + usize::from(c.u16(at + 30)?) + usize::from(c.u16(at + 32)?);
    }
    if let Some(local) = locals.get(members.len()) {
        return Err(format!(
            "{}: local entry absent from the central directory (a hidden member)",
            shown(&local.name)
        ));
    }
    Ok((members, at))
}

/// A member's name as printed: control characters escaped, so a name cannot drive a terminal.
pub fn shown(name: &str) -> String {
    name.escape_debug().to_string()
}
/// One local entry's own rules: stored, not encrypted, sizes in its header, within the limit.
fn check_member(header: &Header, name: &str, max_member: u64) -> Result<(), String> {
    let name = shown(name);
    if header.flags & 0x1 != 0 {
        return Err(format!("{name}: encrypted"));
    }
    if header.flags & 0x8 != 0 {
        return Err(format!(
            "{name}: sizes in a data descriptor after the data, not in its header"
        ));
    }
    if header.method != 0 {
        return Err(format!(
            "{name}: compressed (method {}); build stores every member uncompressed, so \
             nothing is inflated",
            header.method
        ));
    }
    if header.compressed != header.size || header.size == u32::MAX {
        return Err(format!(
            "{name}: stored with a compressed size {} other than its size {}",
            header.compressed, header.size
        ));
    }
    if u64::from(header.size) > max_member {
        return Err(format!(
            "{name}: {} bytes, over the limit of {max_member} bytes for one file",
            header.size
        ));
    }
    Ok(())
}

/// The end record: right after the central directory, describing it, with no comment, and
/// ending the file.
fn check_end(c: &Cursor, at: usize, directory_at: usize, count: usize) -> Result<(), String> {
    if c.signature_at(at) != Some(END) {
        return Err(format!(
            "byte {at}: neither a member, nor the central directory, nor its end record \
             (bytes inside the archive)"
        ));
    }
    let fields = [
        usize::from(c.u16(at + 4)?),
        usize::from(c.u16(at + 6)?),
        usize::from(c.u16(at + 8)?),
        usize::from(c.u16(at + 10)?),
        c.u32(at + 12)? as usize,
        c.u32(at + 16)? as usize,
        usize::from(c.u16(at + 20)?),
    ];
    if fields != [0, 0, count, count, at - directory_at, directory_at, 0] {
        return Err(format!(
            "byte {at}: the end record does not describe the central directory before it \
             (or carries a comment)"
        ));
    }
    let end = at + END_LEN;
    if c.bytes.len() > end {
        return Err(format!(
            "{} bytes after the end of the archive",
            c.bytes.len() - end
        ));
    }
    Ok(())
}

/// The member a byte offset of the archive belongs to (its local entry or data, or its central
/// entry), to name where two archives differ; `None` past the last central entry.
pub fn member_at<'m>(members: &'m [Found], offset: usize) -> Option<&'m str> {
    let local = members.iter().rev().find(|m| m.local_at <= offset);
    let directory_at = members.first().map_or(0, |m| m.central_at);
    if offset < directory_at {
        return local.map(|m| m.name.as_str());
    }
    let last = members.last()?;
    if offset >= last.central_at + CENTRAL_LEN + last.name.len() {
        return None;
    }
    members
        .iter()
        .rev()
        .find(|m| m.central_at <= offset)
        .map(|m| m.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        write(
            "top",
            &[
                Entry {
                    path: "b.txt",
                    bytes: b"beta",
                    executable: false,
                },
                Entry {
                    path: "a.sh",
                    bytes: b"#!/bin/sh\n",
                    executable: true,
                },
            ],
        )
    }

    #[test]
    fn the_canonical_form_is_read_back() {
        let zip = sample();
        assert_eq!(zip, sample());
        let members = read(&zip, 100, 10).unwrap();
        let names: Vec<_> = members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["top/a.sh", "top/b.txt"]);
        assert_eq!(members[0].bytes, b"#!/bin/sh\n");
        assert_eq!(members[0].mode & 0o777, EXEC_MODE);
        assert_eq!(members[1].mode & 0o777, FILE_MODE);
        assert!(!members[1].is_link());
        assert_eq!(member_at(&members, 0), Some("top/a.sh"));
        assert_eq!(
            member_at(&members, members[1].central_at + 1),
            Some("top/b.txt")
        );
        assert_eq!(member_at(&members, zip.len() - 1), None);
    }

    #[test]
    fn anything_around_or_inside_is_refused() {
        let zip = sample();
        let refused = |bytes: &[u8], why: &str| {
            let e = read(bytes, 100, 10).unwrap_err();
            assert!(e.contains(why), "{e} lacks {why}");
        };
        refused(&[b"x".as_slice(), &zip].concat(), "bytes before");
        refused(&[&zip, b"x".as_slice()].concat(), "1 bytes after");
        refused(&zip[..zip.len() - 1], "truncated");
        refused(b"not a zip", "not a zip");
        let e = read(&zip, 5, 10).unwrap_err();
        assert!(e.contains("top/a.sh: 10 bytes, over the limit of 5"), "{e}");
        assert!(read(&zip, 100, 1)
            .unwrap_err()
            .contains("more than 1 members"));
    }
}

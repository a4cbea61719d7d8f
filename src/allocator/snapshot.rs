//! The caching allocator's own map, as the libtorch backend reads it (`snapshot()` through the
//! shim), turned into the same segment and block views the model produces, with every allocated
//! block named after the tensor the protocol made there (`unknown` when none: a finding, never
//! hidden).

use super::size::Pool;
use super::view::{BlockView, SegmentView};
use std::collections::HashMap;

/// The name of an allocated block that no tensor of the protocol accounts for.
pub const UNKNOWN: &str = "unknown";

/// Parses the shim's text (see `torch/csrc/allocator_shim.h`) and names each allocated block by
/// its address in `names`; also says whether any segment is an expandable one.
pub fn parse(text: &str, names: &HashMap<u64, String>) -> Result<(Vec<SegmentView>, bool), String> {
    let mut segments: Vec<SegmentView> = Vec::new();
    let mut expandable = false;
    let mut streams: Vec<u64> = vec![0];
    for (n, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> Result<u64, String> {
            fields
                .get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("snapshot line {}: `{line}`", n + 1))
        };
        match fields.first() {
            // "S address size is_large stream is_expandable"
            Some(&"S") => {
                expandable |= fields.get(5) == Some(&"1");
                let stream = num(4)?;
                let id = match streams.iter().position(|s| *s == stream) {
                    Some(i) => i,
                    None => {
                        streams.push(stream);
                        streams.len() - 1
                    }
                };
                segments.push(SegmentView {
                    address: num(1)?,
                    size: num(2)?,
                    pool: if num(3)? == 1 {
                        Pool::Large
                    } else {
                        Pool::Small
                    },
                    stream: id as u32,
                    blocks: Vec::new(),
                });
            }
            Some(&"B") => {
                let segment = segments.last_mut().ok_or_else(|| {
                    format!("snapshot line {}: a block before any segment", n + 1)
                })?;
                let (address, allocated) = (num(1)?, num(4)? == 1);
                segment.blocks.push(BlockView {
                    address,
                    size: num(2)?,
                    requested_size: num(3)?,
                    allocated,
                    label: allocated.then(|| {
                        names
                            .get(&address)
                            .cloned()
                            .unwrap_or_else(|| UNKNOWN.into())
                    }),
                    inactive_split: false,
                });
            }
            _ => return Err(format!("snapshot line {}: `{line}`", n + 1)),
        }
    }
    for s in &mut segments {
        let split = s.blocks.len() > 1;
        for b in &mut s.blocks {
            b.inactive_split = split && !b.allocated;
        }
    }
    Ok((segments, expandable))
}

/// Allocated bytes of a map (the sum of its allocated blocks).
pub fn allocated_bytes(segments: &[SegmentView]) -> u64 {
    segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.allocated)
        .map(|b| b.size)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_read_and_named() {
        let text = "S 1000 2097152 0 0\nB 1000 65536 65536 1\nB 66536 2031616 0 0\n\
                    S 9000000 33554432 1 0\nB 9000000 33554432 33554432 1\n";
        let names = HashMap::from([(1000, "linear1.weight".to_string())]);
        let (map, _) = parse(text, &names).unwrap();
        assert_eq!(map.len(), 2);
        assert_eq!(map[0].blocks[0].label.as_deref(), Some("linear1.weight"));
        assert!(map[0].blocks[1].inactive_split && map[0].blocks[1].label.is_none());
        assert_eq!(map[1].pool, Pool::Large);
        assert_eq!(map[1].blocks[0].label.as_deref(), Some(UNKNOWN));
        assert_eq!(allocated_bytes(&map), 65536 + 33554432);
        assert!(parse("B 1 2 3 1\n", &names).is_err());
        assert!(parse("S x\n", &names).is_err());
    }
}

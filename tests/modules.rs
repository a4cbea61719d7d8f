//! The library's modules form layers: no module imports from a module that imports it back. Read
//! from the sources: every `crate::…` and `super::…` path outside comments and test modules,
//! resolved to the module file it names, at the level of the top modules (`measure`, `allocator`,
//! `lesson`…) and of their children (`measure::predict`, `companion::process`…).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every module of `src/` by path (`measure::predict`), with its source.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(Path::new(ROOT).join("src")).unwrap();
                let mut parts: Vec<String> = rel
                    .with_extension("")
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect();
                if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                    parts.pop();
                }
                out.insert(parts.join("::"), std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&Path::new(ROOT).join("src"), &mut out);
    out
}

/// The source without its comments and its test module.
fn code(source: &str) -> String {
    let source = source.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    source
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths a source names after `prefix` (`crate::` or `super::`).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    code.match_indices(prefix)
        .map(|(i, _)| {
            let rest = &code[i + prefix.len()..];
            let end = rest
                .find(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':')
                })
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches(':')
        })
        .collect()
}

/// The edges between modules cut at `depth` path segments.
fn edges(depth: usize) -> BTreeSet<(String, String)> {
    let modules = modules();
    let cut = |m: &str| m.split("::").take(depth).collect::<Vec<_>>().join("::");
    let resolve = |path: &str| -> Option<String> {
        let parts: Vec<&str> = path.split("::").collect();
        (1..=parts.len())
            .rev()
            .map(|k| parts[..k].join("::"))
            .find(|m| modules.contains_key(m))
    };
    let mut out = BTreeSet::new();
    for (name, source) in &modules {
        let code = code(source);
        let parent: Vec<&str> = name.split("::").collect();
        let parent = parent[..parent.len().saturating_sub(1)].join("::");
        let mut named: Vec<String> = paths_after(&code, "crate::")
            .into_iter()
            .filter_map(resolve)
            .collect();
        named.extend(paths_after(&code, "super::").into_iter().filter_map(|p| {
            resolve(&if parent.is_empty() {
                p.to_string()
            } else {
                format!("{parent}::{p}")
            })
        }));
        for target in named {
            let (a, b) = (cut(name), cut(&target));
            if a != b && !a.is_empty() && !b.is_empty() {
                out.insert((a, b));
            }
        }
    }
    out
}

fn cycles(depth: usize) -> Vec<String> {
    let e = edges(depth);
    e.iter()
        .filter(|(a, b)| a < b && e.contains(&(b.clone(), a.clone())))
        .map(|(a, b)| format!("{a} <-> {b}"))
        .collect()
}

#[test]
fn no_top_module_imports_from_a_module_that_imports_it_back() {
    let e = edges(1);
    assert!(
        e.contains(&("measure".into(), "allocator".into()))
            && e.contains(&("lesson".into(), "reading".into())),
        "the reading found the imports: {e:?}"
    );
    assert_eq!(cycles(1), Vec::<String>::new());
}

#[test]
fn no_child_module_imports_from_a_module_that_imports_it_back() {
    assert_eq!(cycles(2), Vec::<String>::new());
}

#[test]
fn the_reading_sees_an_import_and_skips_comments() {
    let c = code("use crate::reading::Phase; // crate::measure here\n#[cfg(test)]\nmod tests { use crate::plot; }");
    assert_eq!(paths_after(&c, "crate::"), ["reading"]);
}

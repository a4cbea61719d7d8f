//! The library's modules form layers: no module imports from a module that imports it back. Read
//! from the sources: every `crate::…` and `super::…` path outside comments and test modules,
//! resolved to the module file it names, at the level of the top modules (`measure`, `allocator`,
//! `lesson`…) and of their children (`measure::predict`, `companion::process`…).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every module of `src/` by path (`measure::predict`), with its source; test modules in files of
/// their own (`tests.rs`, `…_tests.rs`) left out.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path
                    .file_stem()
                    .is_some_and(|s| s == "tests" || s.to_string_lossy().ends_with("_tests"))
            {
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

/// The module paths a source names after `prefix` (`crate::` or `super::`), groups opened:
/// `crate::{a::B, c::{d, e}}` names `a::B`, `c::d` and `c::e`.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices(prefix) {
        named_in(&code[i + prefix.len()..], String::new(), &mut out);
    }
    out
}

/// The paths named at the start of `rest` (a path, or a group in braces), after `base`.
fn named_in(rest: &str, base: String, out: &mut Vec<String>) {
    let is_path = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let end = rest.find(|c: char| !is_path(c)).unwrap_or(rest.len());
    let path = format!("{base}{}", &rest[..end]);
    if rest[end..].starts_with('{') {
        // The items of the group, split at its own commas.
        let (mut depth, mut from) = (0, end + 1);
        for (j, c) in rest.char_indices().skip(end) {
            match c {
                '{' => depth += 1,
                '}' | ',' if depth == 1 => {
                    named_in(rest[from..j].trim_start(), path.clone(), out);
                    from = j + 1;
                    if c == '}' {
                        return;
                    }
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
    } else {
        out.push(path.trim_end_matches(':').to_string());
    }
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
            .filter_map(|p| resolve(&p))
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

/// The import cycles between modules cut at `depth` segments: each set of modules that reach
/// one another through their imports, of two or more.
fn cycles(depth: usize) -> Vec<String> {
    let e = edges(depth);
    let names: BTreeSet<&String> = e.iter().flat_map(|(a, b)| [a, b]).collect();
    let reach = |from: &String| -> BTreeSet<&String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from];
        while let Some(m) = todo.pop() {
            for (_, b) in e.iter().filter(|(a, _)| a == m) {
                if seen.insert(b) {
                    todo.push(b);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<&String>> =
        names.iter().map(|&m| (m, reach(m))).collect();
    let mut out = BTreeSet::new();
    for &m in &names {
        let cycle: Vec<&str> = names
            .iter()
            .filter(|&&o| o == m || (reached[m].contains(o) && reached[o].contains(m)))
            .map(|o| o.as_str())
            .collect();
        if cycle.len() > 1 {
            out.insert(cycle.join(" <-> "));
        }
    }
    out.into_iter().collect()
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
    assert_eq!(paths_after(&c, "crate::"), ["reading::Phase"]);
    let c = "use super::{a::B, c::{d, e::F}, g};";
    assert_eq!(paths_after(c, "super::"), ["a::B", "c::d", "c::e::F", "g"]);
}

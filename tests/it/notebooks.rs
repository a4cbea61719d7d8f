//! The committed notebooks are valid and carry no outputs or execution counts; each one loads the
//! library from the repository and opens with the note on the first compile.

use iteragpu_lab::bundle::notebook::unstripped_cells;

fn notebooks() -> Vec<std::path::PathBuf> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/notebooks");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ipynb"))
        .collect();
    v.sort();
    v
}

#[test]
fn notebooks_are_committed_stripped() {
    let all = notebooks();
    assert_eq!(all.len(), 3, "{all:?}");
    for path in all {
        let bytes = std::fs::read(&path).unwrap();
        let problems = unstripped_cells(&bytes).unwrap();
        assert!(problems.is_empty(), "{}: {problems:?}", path.display());
        let nb: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(nb["metadata"]["kernelspec"]["name"], "iteragpu-rust");
        let text = serde_json::to_string(&nb["cells"]).unwrap();
        // The library without its command line (the GPU work runs in the companion); a notebook
        // that used the libtorch backend would take it without its command line too.
        assert!(text.contains(r#":dep iteragpu-lab = { path = \"..\", default-features = false }"#));
        if text.contains("iteragpu-torch") {
            assert!(text.contains(
                r#":dep iteragpu-torch = { path = \"../torch\", default-features = false }"#
            ));
        }
        assert!(
            text.contains("takes a while to start"),
            "{}: says why the first compile takes a while",
            path.display()
        );
    }
}

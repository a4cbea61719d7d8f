//! Notebook hygiene: notebooks are shipped with outputs and execution counts stripped.

/// Problems that keep a notebook from being shipped, one message per offending cell.
pub fn unstripped_cells(bytes: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    let nb: serde_json::Value = serde_json::from_slice(bytes)?;
    let cells = nb["cells"].as_array().cloned().unwrap_or_default();
    Ok(cells
        .iter()
        .enumerate()
        .filter(|(_, c)| c["cell_type"] == "code")
        .filter_map(|(i, c)| {
            let outputs = c["outputs"].as_array().is_some_and(|o| !o.is_empty());
            let count = !c["execution_count"].is_null();
            (outputs || count)
                .then(|| format!("code cell {i} carries outputs or an execution count"))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_and_counts_are_found() {
        let clean =
            br#"{"cells":[{"cell_type":"code","execution_count":null,"outputs":[],"source":[]}]}"#;
        assert!(unstripped_cells(clean).unwrap().is_empty());
        let run = br#"{"cells":[{"cell_type":"markdown","source":[]},{"cell_type":"code","execution_count":3,"outputs":[],"source":[]}]}"#;
        assert_eq!(
            unstripped_cells(run).unwrap(),
            ["code cell 1 carries outputs or an execution count"]
        );
    }
}

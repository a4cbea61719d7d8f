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

    /// A code cell as Jupyter saves it after a run, with its count cleared: the outputs alone
    /// must keep the notebook from being shipped.
    fn cell_with_output(output: &str) -> String {
        format!(
            r#"{{"cell_type":"code","execution_count":null,"metadata":{{}},"outputs":[{output}],"source":["1 + 1"]}}"#
        )
    }

    #[test]
    fn real_outputs_are_refused_without_an_execution_count() {
        let outputs = [
            r#"{"output_type":"stream","name":"stdout","text":["2\n"]}"#,
            r#"{"output_type":"execute_result","execution_count":1,"data":{"text/plain":["2"]},"metadata":{}}"#,
            r#"{"output_type":"display_data","data":{"text/html":["<table></table>"],"text/plain":["table"]},"metadata":{}}"#,
            r#"{"output_type":"error","ename":"Error","evalue":"boom","traceback":["boom"]}"#,
        ];
        for output in outputs {
            let cells = [
                r#"{"cell_type":"markdown","metadata":{},"source":["Title"]}"#.to_string(),
                cell_with_output(output),
            ];
            let nb = format!(
                r#"{{"cells":[{}],"metadata":{{}},"nbformat":4,"nbformat_minor":5}}"#,
                cells.join(",")
            );
            assert_eq!(
                unstripped_cells(nb.as_bytes()).unwrap(),
                ["code cell 1 carries outputs or an execution count"],
                "{output}"
            );
        }
        // Every offending cell is named, each once.
        let two = format!(
            r#"{{"cells":[{},{}],"metadata":{{}},"nbformat":4,"nbformat_minor":5}}"#,
            cell_with_output(r#"{"output_type":"stream","name":"stderr","text":["w"]}"#),
            cell_with_output(r#"{"output_type":"stream","name":"stdout","text":["x"]}"#)
        );
        assert_eq!(
            unstripped_cells(two.as_bytes()).unwrap(),
            [
                "code cell 0 carries outputs or an execution count",
                "code cell 1 carries outputs or an execution count"
            ]
        );
        // A notebook that is not JSON is an error, not a clean notebook.
        assert!(unstripped_cells(b"{\"cells\": [").is_err());
    }
}

//! The Alibaba openb node list (`openb_node_list_gpu_node.csv`,
//! `openb_node_list_all_node.csv`): the GPU nodes a replay of the openb trace runs on.

use std::collections::HashMap;

use super::TraceError;
use super::cells::{parse_nonempty, parse_u64};
use super::csv_reader::{Column, Reader};

/// A GPU node of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedNode {
    /// The node's serial name (`sn`), unique in the list.
    pub name: String,
    /// The GPU model (`model`), e.g. `T4`, `V100M16`, or an undisclosed `G2`.
    pub gpu_model: String,
    /// GPUs on the node, 1..=1024.
    pub gpu_count: u32,
}

/// A parsed node list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeList {
    /// The GPU nodes, in file order.
    pub nodes: Vec<ListedNode>,
    /// Nodes without GPUs, left out: the simulator places only GPU work.
    pub skipped_cpu_only: u64,
}

/// More GPUs than this on one node is taken for a damaged cell rather than
/// hardware (the largest openb node has 8).
const MAX_GPUS_PER_NODE: u64 = 1024;

const NODE_COLUMNS: &[Column] = &[
    Column::required("sn"),
    Column::ignored("cpu_milli"),
    Column::ignored("memory_mib"),
    Column::required("gpu"),
    Column::required("model"),
];

/// Parses `content` (the text of the file shown to users as `file`) as an
/// openb node list with header `sn,cpu_milli,memory_mib,gpu,model`.
pub fn parse_node_list(file: &str, content: &str) -> Result<NodeList, TraceError> {
    let mut reader = Reader::new(file, content);
    let header = reader.header(NODE_COLUMNS, "sn,cpu_milli,memory_mib,gpu,model")?;
    let sn = header.index("sn")?;
    let gpu = header.index("gpu")?;
    let model = header.index("model")?;
    let mut list = NodeList::default();
    // Name -> line, to point a duplicate at the first occurrence.
    let mut seen: HashMap<String, u64> = HashMap::new();
    while let Some(row) = reader.next_row(&header)? {
        let gpus = row.get(gpu, "gpu", |cell| {
            let gpus = parse_u64(cell)?;
            if gpus > MAX_GPUS_PER_NODE {
                return Err(format!(
                    "`{gpus}` GPUs on one node is more than {MAX_GPUS_PER_NODE}"
                ));
            }
            u32::try_from(gpus).map_err(|_| format!("`{gpus}` GPUs is too large"))
        })?;
        if gpus == 0 {
            list.skipped_cpu_only += 1;
            continue;
        }
        let name = row.get(sn, "sn", parse_nonempty)?;
        let gpu_model = row.get(model, "model", |cell| {
            parse_nonempty(cell).map_err(|message| format!("{message} on a node with GPUs"))
        })?;
        if let Some(first) = seen.insert(name.clone(), row.line()) {
            return Err(row.column_error(
                "sn",
                format!("duplicate node `{name}` (first on line {first})"),
            ));
        }
        list.nodes.push(ListedNode {
            name,
            gpu_model,
            gpu_count: gpus,
        });
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::test_support::read_shared_trace;
    use super::*;

    const HEADER: &str = "sn,cpu_milli,memory_mib,gpu,model\n";

    fn node(name: &str, gpu_model: &str, gpu_count: u32) -> ListedNode {
        ListedNode {
            name: name.to_string(),
            gpu_model: gpu_model.to_string(),
            gpu_count,
        }
    }

    fn assert_err(content: &str, line: u64, needle: &str) {
        let error = parse_node_list("nodes.csv", content).unwrap_err();
        assert_eq!(
            (error.file.as_str(), error.line),
            ("nodes.csv", line),
            "{error}"
        );
        assert!(
            error.message.contains(needle),
            "`{error}` should contain `{needle}`"
        );
        assert!(
            error
                .to_string()
                .starts_with(&format!("nodes.csv:{line}: "))
        );
    }

    #[test]
    fn node_list_parses_gpu_nodes_in_file_order() {
        let content = format!(
            "\u{feff}{HEADER}\
             openb-node-0000,64000,262144,2,P100\r\n\
             \r\n\
             openb-node-0001 , 96000,786432, 8 , V100M32 \r\n\
             \"openb-node,0002\",32000,131072,1,T4\n"
        );
        let list = parse_node_list("nodes.csv", &content).unwrap();
        assert_eq!(
            list,
            NodeList {
                nodes: vec![
                    node("openb-node-0000", "P100", 2),
                    node("openb-node-0001", "V100M32", 8),
                    node("openb-node,0002", "T4", 1),
                ],
                skipped_cpu_only: 0,
            }
        );
        // Columns may come in any order; extra columns are ignored.
        let reordered = "model,gpu,sn,rack\nA10,1,n1,r7\n";
        let list = parse_node_list("nodes.csv", reordered).unwrap();
        assert_eq!(list.nodes, [node("n1", "A10", 1)]);
    }

    #[test]
    fn node_list_skips_and_counts_cpu_only_nodes() {
        let content = format!(
            "{HEADER}\
             cpu-0,32000,262144,0,\n\
             gpu-0,64000,262144,4,G2\n\
             cpu-1,32000,262144,0,\n\
             cpu-2,32000,262144,0,G1\n\
             gpu-1,64000,262144,1024,G3\n"
        );
        let list = parse_node_list("nodes.csv", &content).unwrap();
        assert_eq!(list.skipped_cpu_only, 3);
        assert_eq!(
            list.nodes,
            [node("gpu-0", "G2", 4), node("gpu-1", "G3", 1024)]
        );
        let only_cpu = format!("{HEADER}cpu-0,32000,262144,0,\n");
        let list = parse_node_list("nodes.csv", &only_cpu).unwrap();
        assert_eq!((list.nodes.len(), list.skipped_cpu_only), (0, 1));
        assert_eq!(
            parse_node_list("nodes.csv", HEADER),
            Ok(NodeList::default())
        );
    }

    #[test]
    fn node_list_errors_name_the_line() {
        assert_err("", 1, "empty file");
        assert_err("\n\nname,gpus\n", 3, "missing or wrong header `name,gpus`");
        assert_err("sn,gpu\n", 1, "lacks column(s) model");
        assert_err("sn,gpu,model,gpu\n", 1, "duplicate column `gpu`");
        let good = "n0,1,1,8,T4\n";
        let bad_rows = [
            (
                "n1,1,1,2,\n",
                "column `model`: must not be empty on a node with GPUs",
            ),
            ("n1,1,1,2,  \n", "column `model`"),
            (",1,1,2,T4\n", "column `sn`: must not be empty"),
            (
                "n1,1,1,-1,T4\n",
                "column `gpu`: `-1` is not a non-negative whole number",
            ),
            (
                "n1,1,1,2.5,T4\n",
                "column `gpu`: `2.5` is not a non-negative whole number",
            ),
            ("n1,1,1,,T4\n", "column `gpu`: must not be empty"),
            ("n1,1,1,1025,T4\n", "more than 1024"),
            ("n1,1,1,99999999999999999999,T4\n", "column `gpu`"),
            ("n1,1,1,2\n", "expected 5 fields"),
            ("n1,1,1,2,T4,x\n", "found 6"),
            ("n1,1,1,2,\"T4\n", "no closing quote"),
            ("n1,1,1,2,\"T4\"x\n", "after the closing quote"),
            ("n0,1,1,2,T4\n", "duplicate node `n0` (first on line 2)"),
        ];
        for (bad, needle) in bad_rows {
            let content = format!("{HEADER}{good}\r\n{bad}{good}");
            assert_err(&content, 4, needle);
        }
    }

    /// Per-model node counts of `list`.
    fn models(list: &NodeList) -> BTreeMap<&str, u64> {
        list.nodes.iter().fold(BTreeMap::new(), |mut models, node| {
            *models.entry(node.gpu_model.as_str()).or_default() += 1;
            models
        })
    }

    /// The GPU node list from the shared data directory, against its SOURCE.md:
    /// 1,213 GPU nodes with 6,212 GPUs.
    #[test]
    fn full_gpu_node_list_matches_source_md() {
        let content = read_shared_trace("alibaba-gpu-v2023-openb/openb_node_list_gpu_node.csv");
        let list = parse_node_list("openb_node_list_gpu_node.csv", &content).unwrap();
        assert_eq!(list.nodes.len(), 1_213);
        assert_eq!(list.skipped_cpu_only, 0);
        let gpus: u64 = list
            .nodes
            .iter()
            .map(|node| u64::from(node.gpu_count))
            .sum();
        assert_eq!(gpus, 6_212);
        let expected = [
            ("G2", 549),
            ("T4", 404),
            ("P100", 134),
            ("V100M16", 55),
            ("G3", 39),
            ("V100M32", 30),
            ("A10", 2),
        ];
        assert_eq!(models(&list), BTreeMap::from(expected));
    }

    /// The full node list (1,523 nodes, 310 CPU-only) yields the same GPU nodes.
    #[test]
    fn full_all_node_list_skips_the_cpu_only_nodes() {
        let all = read_shared_trace("alibaba-gpu-v2023-openb/openb_node_list_all_node.csv");
        let all = parse_node_list("openb_node_list_all_node.csv", &all).unwrap();
        assert_eq!(all.skipped_cpu_only, 310);
        assert_eq!(all.nodes.len(), 1_523 - 310);
        let gpu = read_shared_trace("alibaba-gpu-v2023-openb/openb_node_list_gpu_node.csv");
        let gpu = parse_node_list("openb_node_list_gpu_node.csv", &gpu).unwrap();
        assert_eq!(models(&all), models(&gpu));
        let gpus = |list: &NodeList| -> u64 {
            list.nodes
                .iter()
                .map(|node| u64::from(node.gpu_count))
                .sum()
        };
        assert_eq!(gpus(&all), gpus(&gpu));
    }
}

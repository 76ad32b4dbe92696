//! GPU inventory: `nvidia-smi` discovery, `--gpus` declarations, and the
//! mapping from driver GPU names to Axle GPU classes.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{GpuSpec, NodeSpec};
use crate::gpu_class::gpu_class;

/// Memory assumed for a declared GPU without `:MEMGB` (the 80 GB of an H100/A100-80GB).
pub const DEFAULT_DECL_MEMORY_GB: u64 = 80;
/// The most GPUs one declared node may have. Real nodes hold 8–16; the bound
/// leaves room for large fake nodes in dev setups while catching typos like `800xH100`.
pub const MAX_DECLARED_GPUS_PER_NODE: u32 = 256;
/// The most memory one declared GPU may have (today's largest have under 300 GB).
pub const MAX_DECLARED_MEMORY_GB: u64 = 4096;
/// How long `nvidia-smi` may take: it answers in well under a second on a
/// healthy node, and hangs forever on a wedged driver, which must not hang startup.
pub const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(15);
/// How often to check whether `nvidia-smi` has exited.
const NVIDIA_SMI_POLL: Duration = Duration::from_millis(20);
const MIB_PER_GIB: u64 = 1024;

/// A bad `--gpus`/`--node` combination or value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuDeclError {
    #[error(
        "invalid --gpus value {value:?}: {reason}; expected COUNTxMODEL[:MEMGB], e.g. 8xH100:80GB"
    )]
    Malformed { value: String, reason: String },
    #[error(
        "{names} --node names for {decls} --gpus declarations: give at most one --node per --gpus"
    )]
    TooManyNodeNames { names: usize, decls: usize },
}

/// Why the GPU inventory could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(transparent)]
    Decl(#[from] GpuDeclError),
    #[error("cannot parse nvidia-smi output line {line} {text:?}: {reason}")]
    SmiParse {
        line: usize,
        text: String,
        reason: String,
    },
    #[error("nvidia-smi failed: {0}")]
    SmiFailed(String),
}

fn malformed(value: &str, reason: impl Into<String>) -> GpuDeclError {
    GpuDeclError::Malformed {
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Parses one `--gpus` value `COUNTxMODEL[:MEMGB]` (e.g. `8xH100:80GB`,
/// `4xA100:40`, `2xl4`) into (count, model uppercased, memory in GB).
pub fn parse_gpu_decl(s: &str) -> Result<(u32, String, u64), GpuDeclError> {
    let text = s.trim();
    let Some((count_text, rest)) = text.split_once(['x', 'X']) else {
        return Err(malformed(s, "missing 'x' between count and model"));
    };
    let count: u32 = count_text
        .trim()
        .parse()
        .map_err(|_| malformed(s, format!("count {count_text:?} is not a whole number")))?;
    if count == 0 || count > MAX_DECLARED_GPUS_PER_NODE {
        return Err(malformed(
            s,
            format!("count must be 1..={MAX_DECLARED_GPUS_PER_NODE}"),
        ));
    }
    let (model_text, memory_text) = match rest.split_once(':') {
        Some((model, memory)) => (model.trim(), Some(memory.trim())),
        None => (rest.trim(), None),
    };
    if model_text.is_empty() {
        return Err(malformed(s, "model is empty"));
    }
    if !model_text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(malformed(
            s,
            format!("model {model_text:?} may hold only letters, digits, '-' and '_'"),
        ));
    }
    let memory_gb = match memory_text {
        None => DEFAULT_DECL_MEMORY_GB,
        Some(memory) => {
            let digits = memory
                .strip_suffix("GB")
                .or_else(|| memory.strip_suffix("gb"))
                .or_else(|| memory.strip_suffix("G"))
                .unwrap_or(memory);
            let gb: u64 = digits
                .trim()
                .parse()
                .map_err(|_| malformed(s, format!("memory {memory:?} is not a number of GB")))?;
            if gb == 0 || gb > MAX_DECLARED_MEMORY_GB {
                return Err(malformed(
                    s,
                    format!("memory must be 1..={MAX_DECLARED_MEMORY_GB} GB"),
                ));
            }
            gb
        }
    };
    Ok((count, model_text.to_ascii_uppercase(), memory_gb))
}

/// Parses `nvidia-smi --query-gpu=index,name,memory.total` output in either
/// `--format=csv,noheader,nounits` or `--format=csv` (header line, `MiB` units).
pub fn parse_nvidia_smi(output: &str) -> Result<Vec<GpuSpec>, DiscoverError> {
    let mut gpus = Vec::new();
    for (i, raw) in output.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with("index") {
            continue;
        }
        let parse_err = |reason: &str| DiscoverError::SmiParse {
            line: i + 1,
            text: line.to_string(),
            reason: reason.to_string(),
        };
        // The name sits between the first and the last comma, so split from both ends.
        let (index_text, rest) = line
            .split_once(',')
            .ok_or_else(|| parse_err("expected `index, name, memory.total`"))?;
        let (name, memory_text) = rest
            .rsplit_once(',')
            .ok_or_else(|| parse_err("expected `index, name, memory.total`"))?;
        let index: u32 = index_text
            .trim()
            .parse()
            .map_err(|_| parse_err("index is not a number"))?;
        let memory_text = memory_text.trim();
        let memory_text = memory_text
            .strip_suffix("MiB")
            .unwrap_or(memory_text)
            .trim();
        let memory_mb: u64 = memory_text
            .parse()
            .map_err(|_| parse_err("memory.total is not a number of MiB"))?;
        gpus.push(GpuSpec::whole(index, &gpu_class(name), memory_mb));
    }
    Ok(gpus)
}

/// Builds the node list from declarations (which win) or `nvidia-smi` output.
/// Pure: `smi_output` is what `nvidia-smi` printed, or `None` when it is absent.
pub fn build_nodes(
    declared: &[String],
    node_names: &[String],
    host: &str,
    smi_output: Option<&str>,
) -> Result<Vec<NodeSpec>, DiscoverError> {
    if !declared.is_empty() {
        if node_names.len() > declared.len() {
            return Err(GpuDeclError::TooManyNodeNames {
                names: node_names.len(),
                decls: declared.len(),
            }
            .into());
        }
        let mut nodes = Vec::with_capacity(declared.len());
        for (i, decl) in declared.iter().enumerate() {
            let (count, model, memory_gb) = parse_gpu_decl(decl)?;
            let name = node_names
                .get(i)
                .cloned()
                .unwrap_or_else(|| format!("node-{i}"));
            let gpus = (0..count)
                .map(|index| GpuSpec::whole(index, &model, memory_gb * MIB_PER_GIB))
                .collect();
            nodes.push(NodeSpec {
                name,
                gpus,
                whole_only: false,
                topology: String::new(),
            });
        }
        return Ok(nodes);
    }
    if node_names.len() > 1 {
        return Err(GpuDeclError::TooManyNodeNames {
            names: node_names.len(),
            decls: 1,
        }
        .into());
    }
    let name = node_names
        .first()
        .cloned()
        .unwrap_or_else(|| host.to_string());
    let gpus = match smi_output {
        Some(output) => parse_nvidia_smi(output)?,
        // No nvidia-smi and nothing declared: a CPU-only node.
        None => Vec::new(),
    };
    Ok(vec![NodeSpec {
        name,
        gpus,
        whole_only: false,
        topology: String::new(),
    }])
}

/// Runs `nvidia-smi` when nothing is declared; `Ok(None)` when it is not installed.
fn run_nvidia_smi() -> Result<Option<String>, DiscoverError> {
    let mut child = match Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DiscoverError::SmiFailed(e.to_string())),
    };
    let deadline = Instant::now() + NVIDIA_SMI_TIMEOUT;
    // Its output is a line per GPU, far below a pipe's buffer, so waiting
    // before reading cannot deadlock.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                // Best effort: the process is wedged and we report that anyway.
                let _ = child.kill();
                let _ = child.wait();
                return Err(DiscoverError::SmiFailed(format!(
                    "no answer within {} s",
                    NVIDIA_SMI_TIMEOUT.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(NVIDIA_SMI_POLL),
            Err(e) => return Err(DiscoverError::SmiFailed(e.to_string())),
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout)
            .map_err(|e| DiscoverError::SmiFailed(e.to_string()))?;
    }
    if let Some(mut err) = child.stderr.take() {
        // Only used in the error message; unreadable stderr is not itself an error.
        let _ = err.read_to_string(&mut stderr);
    }
    if !status.success() {
        return Err(DiscoverError::SmiFailed(format!(
            "{status}: {}",
            stderr.trim()
        )));
    }
    Ok(Some(stdout))
}

/// The machine's host name, for naming the node `nvidia-smi` describes.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".into())
}

/// The cluster's nodes: one per `--gpus` declaration (named by `--node` in the
/// same order, default `node-0`, `node-1`, …) when any are given; otherwise one
/// node named after the host (or the single `--node`) with the GPUs
/// `nvidia-smi` reports, or none when `nvidia-smi` is not installed.
pub fn discover_gpus(
    declared: &[String],
    node_names: &[String],
) -> Result<Vec<NodeSpec>, DiscoverError> {
    let smi_output = if declared.is_empty() {
        run_nvidia_smi()?
    } else {
        None
    };
    build_nodes(declared, node_names, &host_name(), smi_output.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_real_driver_names() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", "H100"),
            ("NVIDIA H100 PCIe", "H100"),
            ("NVIDIA A100-SXM4-80GB", "A100"),
            ("NVIDIA A100-PCIE-40GB", "A100"),
            ("A100-SXM4-40GB", "A100"),
            ("Tesla V100-SXM2-32GB", "V100"),
            ("Tesla T4", "T4"),
            ("NVIDIA L4", "L4"),
            ("NVIDIA L40S", "L40S"),
            ("NVIDIA L40", "L40"),
            ("NVIDIA A10G", "A10G"),
            ("NVIDIA A10", "A10"),
            ("NVIDIA GeForce RTX 4090", "RTX4090"),
            ("NVIDIA GeForce RTX 3090", "RTX3090"),
            ("NVIDIA RTX A6000", "A6000"),
            ("NVIDIA H200", "H200"),
            ("NVIDIA H200 141GB HBM3e", "H200"),
            ("NVIDIA GH200 480GB", "GH200"),
            ("NVIDIA B200", "B200"),
            ("Tesla P100-PCIE-16GB", "P100"),
            ("AMD Instinct MI300X", "MI300X"),
            ("AMD Instinct MI250X", "MI250"),
            ("Quadro RTX 8000", "QUADRO"),
            ("", "UNKNOWN"),
        ];
        for (name, class) in cases {
            assert_eq!(gpu_class(name), class, "{name}");
        }
    }

    #[test]
    fn parses_noheader_nounits_output() {
        let out = "0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559\n";
        let gpus = parse_nvidia_smi(out).expect("parses");
        assert_eq!(
            gpus,
            vec![
                GpuSpec::whole(0, "H100", 81559),
                GpuSpec::whole(1, "H100", 81559),
            ]
        );
    }

    #[test]
    fn parses_csv_with_header_and_units() {
        let out = "index, name, memory.total [MiB]\n\
                   0, NVIDIA H100 80GB HBM3, 81559 MiB\n\
                   1, NVIDIA A100-SXM4-80GB, 81920 MiB\n\
                   2, NVIDIA A100-PCIE-40GB, 40960 MiB\n\
                   3, Tesla V100-SXM2-32GB, 32768 MiB\n\
                   4, Tesla T4, 15360 MiB\n\
                   5, NVIDIA L4, 23034 MiB\n\
                   6, NVIDIA A10G, 23028 MiB\n\
                   7, NVIDIA GeForce RTX 4090, 24564 MiB\n\
                   8, NVIDIA H200, 143771 MiB\n";
        let gpus = parse_nvidia_smi(out).expect("parses");
        let got: Vec<(u32, &str, u64)> = gpus
            .iter()
            .map(|g| (g.index, g.model.as_str(), g.memory_mb))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "H100", 81559),
                (1, "A100", 81920),
                (2, "A100", 40960),
                (3, "V100", 32768),
                (4, "T4", 15360),
                (5, "L4", 23034),
                (6, "A10G", 23028),
                (7, "RTX4090", 24564),
                (8, "H200", 143771),
            ]
        );
    }

    #[test]
    fn smi_garbage_names_the_line() {
        let err = parse_nvidia_smi("0, NVIDIA H100, 81559\nNo devices were found\n")
            .expect_err("garbage");
        let text = err.to_string();
        assert!(text.contains("line 2"), "{text}");
        let err = parse_nvidia_smi("0, NVIDIA H100, [N/A]\n").expect_err("n/a");
        assert!(err.to_string().contains("memory.total"), "{err}");
    }

    #[test]
    fn gpu_declarations() {
        assert_eq!(parse_gpu_decl("8xH100:80GB"), Ok((8, "H100".into(), 80)));
        assert_eq!(parse_gpu_decl("4xA100:40"), Ok((4, "A100".into(), 40)));
        assert_eq!(parse_gpu_decl("2xl4"), Ok((2, "L4".into(), 80)));
        assert_eq!(parse_gpu_decl("1XT4:16gb"), Ok((1, "T4".into(), 16)));
        for bad in [
            "",
            "8",
            "H100",
            "0xH100",
            "axH100",
            "8x",
            "8xH100:",
            "8xH100:lots",
            "8xH 100",
            "999xH100",
        ] {
            let err = parse_gpu_decl(bad).expect_err(bad);
            let text = err.to_string();
            assert!(text.contains("COUNTxMODEL[:MEMGB]"), "{text}");
            assert!(text.contains(&format!("{bad:?}")), "{text}");
        }
    }

    #[test]
    fn declared_nodes_win_and_take_names_in_order() {
        let declared = vec!["2xH100".to_string(), "1xA100:40GB".to_string()];
        let names = vec!["gpu-a".to_string()];
        let nodes =
            build_nodes(&declared, &names, "host", Some("0, NVIDIA L4, 23034\n")).expect("nodes");
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].name, "gpu-a");
        assert_eq!(nodes[0].gpus.len(), 2);
        assert_eq!(nodes[0].gpus[1].index, 1);
        assert_eq!(nodes[0].gpus[1].memory_mb, 80 * 1024);
        assert_eq!(nodes[1].name, "node-1");
        assert_eq!(nodes[1].gpus[0].model, "A100");
        assert_eq!(nodes[1].gpus[0].memory_mb, 40 * 1024);
    }

    #[test]
    fn smi_node_is_named_after_host_or_node_flag() {
        let smi = Some("0, NVIDIA L4, 23034\n");
        let nodes = build_nodes(&[], &[], "box1", smi).expect("nodes");
        assert_eq!(nodes[0].name, "box1");
        assert_eq!(nodes[0].gpus[0].model, "L4");
        let nodes = build_nodes(&[], &["n".to_string()], "box1", smi).expect("nodes");
        assert_eq!(nodes[0].name, "n");
        let nodes = build_nodes(&[], &[], "box1", None).expect("nodes");
        assert!(nodes[0].gpus.is_empty());
    }

    #[test]
    fn too_many_node_names_is_an_error() {
        let err = build_nodes(
            &["1xH100".to_string()],
            &["a".to_string(), "b".to_string()],
            "h",
            None,
        )
        .expect_err("two names for one node");
        assert!(err.to_string().contains("--node"), "{err}");
    }
}

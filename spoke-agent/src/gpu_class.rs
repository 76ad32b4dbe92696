//! Axle's GPU class names from what drivers and device plugins call a GPU
//! (`NVIDIA A100-SXM4-80GB`, `NVIDIA-H100-80GB-HBM3`): one name per family,
//! whichever driver reports it.

/// Known GPU families, checked in this order against the words of a driver
/// name; each with the words (or word pairs joined) that name it.
const GPU_FAMILIES: &[(&str, &[&str])] = &[
    ("B200", &["B200"]),
    ("H200", &["H200"]),
    ("GH200", &["GH200"]),
    ("H100", &["H100"]),
    ("A100", &["A100"]),
    ("A10G", &["A10G"]),
    ("A10", &["A10"]),
    ("A6000", &["A6000"]),
    ("A40", &["A40"]),
    ("L40S", &["L40S"]),
    ("L40", &["L40"]),
    ("L4", &["L4"]),
    ("T4", &["T4"]),
    ("V100", &["V100", "V100S"]),
    ("P100", &["P100"]),
    ("RTX4090", &["RTX4090"]),
    ("RTX3090", &["RTX3090"]),
    ("MI300X", &["MI300X"]),
    ("MI250", &["MI250", "MI250X"]),
];

/// Maps a driver GPU name (`NVIDIA H100 80GB HBM3`, `Tesla T4`) to an Axle GPU
/// class (`H100`, `T4`); an unknown name maps to its first word uppercased.
pub fn gpu_class(driver_name: &str) -> String {
    let name = driver_name.trim();
    let name = name.strip_prefix("NVIDIA ").unwrap_or(name).trim();
    let words: Vec<String> = name
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    // "GeForce RTX 4090" spells the class across two words.
    let pairs: Vec<String> = words.windows(2).map(|w| w.concat()).collect();
    for (class, aliases) in GPU_FAMILIES {
        let named = words
            .iter()
            .chain(pairs.iter())
            .any(|w| aliases.contains(&w.as_str()));
        if named {
            return (*class).to_string();
        }
    }
    words.first().cloned().unwrap_or_else(|| "UNKNOWN".into())
}

//! The facts the node's runtime gives a bundle through its environment (MESH_*).

use std::{fmt, io, path::PathBuf};

/// Who and where this bundle is, as the runtime that launched it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The node's name (MESH_NODE).
    pub node: String,
    /// The module this bundle belongs to (MESH_MODULE).
    pub module: String,
    /// This bundle's name in the module (MESH_BUNDLE).
    pub bundle: String,
    /// The unpacked bundle folder (MESH_BUNDLE_DIR); replaced on upgrade, so keep no state there.
    pub bundle_dir: PathBuf,
    /// Persistent per-module data (MESH_DATA_DIR); survives upgrades and restarts.
    pub data_dir: PathBuf,
}

/// Why the facts could not be had.
#[derive(Debug)]
pub enum FactsError {
    /// These variables are unset or empty: the process was not started by the mesh runtime.
    Missing(Vec<&'static str>),
    /// The data folder did not exist and could not be created.
    DataDir { path: PathBuf, source: io::Error },
}

impl fmt::Display for FactsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FactsError::Missing(names) => write!(
                f,
                "{} {} not set: this bundle was not started by the mesh runtime; set them ({}) to run it by hand",
                names.join(", "),
                if names.len() == 1 { "is" } else { "are" },
                VARIABLES.join(", "),
            ),
            FactsError::DataDir { path, source } => {
                write!(
                    f,
                    "cannot create the data folder {}: {source}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for FactsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FactsError::DataDir { source, .. } => Some(source),
            FactsError::Missing(_) => None,
        }
    }
}

const VARIABLES: [&str; 5] = [
    "MESH_NODE",
    "MESH_MODULE",
    "MESH_BUNDLE",
    "MESH_BUNDLE_DIR",
    "MESH_DATA_DIR",
];

/// Read the MESH_* facts and create the data folder if it is not there yet.
///
/// There is deliberately no fallback: a data folder guessed when the variable is missing would
/// be a second, unconnected store, which the mesh's failure rule forbids.
pub fn facts() -> Result<Facts, FactsError> {
    facts_from(|name| std::env::var(name).ok())
}

// The environment is a parameter so tests need not change the process's own (unsafe in 2024).
pub(crate) fn facts_from(get: impl Fn(&str) -> Option<String>) -> Result<Facts, FactsError> {
    let values: Vec<String> = VARIABLES
        .iter()
        .map(|name| get(name).unwrap_or_default())
        .collect();
    let missing: Vec<&'static str> = VARIABLES
        .iter()
        .zip(&values)
        .filter(|(_, value)| value.is_empty())
        .map(|(name, _)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(FactsError::Missing(missing));
    }
    let [node, module, bundle, bundle_dir, data_dir] =
        <[String; 5]>::try_from(values).expect("five variables");
    let data_dir = PathBuf::from(data_dir);
    std::fs::create_dir_all(&data_dir).map_err(|source| FactsError::DataDir {
        path: data_dir.clone(),
        source,
    })?;
    Ok(Facts {
        node,
        module,
        bundle,
        bundle_dir: PathBuf::from(bundle_dir),
        data_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mesh-sdk-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn reads_all_facts_and_creates_the_data_dir() {
        let root = scratch("facts");
        let data = root.join("data/hello");
        let got = facts_from(env(&[
            ("MESH_NODE", "n1"),
            ("MESH_MODULE", "hello"),
            ("MESH_BUNDLE", "tools"),
            ("MESH_BUNDLE_DIR", "/srv/bundles/hello"),
            ("MESH_DATA_DIR", data.to_str().unwrap()),
        ]))
        .unwrap();
        assert_eq!(
            (got.node.as_str(), got.module.as_str(), got.bundle.as_str()),
            ("n1", "hello", "tools")
        );
        assert_eq!(got.bundle_dir, PathBuf::from("/srv/bundles/hello"));
        assert_eq!(got.data_dir, data);
        assert!(data.is_dir());
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn names_every_missing_variable() {
        let err = facts_from(env(&[("MESH_NODE", "n1"), ("MESH_MODULE", "")])).unwrap_err();
        match &err {
            FactsError::Missing(names) => {
                assert_eq!(
                    names,
                    &[
                        "MESH_MODULE",
                        "MESH_BUNDLE",
                        "MESH_BUNDLE_DIR",
                        "MESH_DATA_DIR"
                    ]
                )
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("not started by the mesh runtime"));
    }

    #[test]
    fn reports_a_data_dir_that_cannot_be_made() {
        let root = scratch("blocked");
        std::fs::create_dir_all(&root).unwrap();
        let file = root.join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = facts_from(env(&[
            ("MESH_NODE", "n1"),
            ("MESH_MODULE", "hello"),
            ("MESH_BUNDLE", "tools"),
            ("MESH_BUNDLE_DIR", "/b"),
            ("MESH_DATA_DIR", file.join("data").to_str().unwrap()),
        ]))
        .unwrap_err();
        assert!(matches!(err, FactsError::DataDir { .. }), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }
}

//! The kernel backend: runs the `nft` program. A transaction is piped to
//! `nft -f -` (one process per transaction, all or nothing), a dry run uses
//! `nft --check -f -`, and a table is read back with `nft -j list table`.

use std::sync::Arc;

use crate::backend::{Backend, TableState};
use crate::error::NftError;
use crate::ir::Family;
use crate::process::{Runner, System};
use crate::tx::Transaction;

/// Oldest nft verdict supports (kube-proxy's floor: earlier versions
/// mis-handle some of the syntax we use).
pub const MIN_NFT_VERSION: (u32, u32, u32) = (1, 0, 1);

/// Runs `nft`, optionally inside a named network namespace.
#[derive(Clone, Debug)]
pub struct NftCli {
    prefix: Vec<String>,
    version: (u32, u32, u32),
    runner: Arc<dyn Runner>,
}

impl NftCli {
    /// `nft` from `$PATH`, in the caller's network namespace. Fails if nft
    /// is missing or older than [`MIN_NFT_VERSION`].
    pub fn new() -> Result<NftCli, NftError> {
        NftCli::with_prefix(vec!["nft".into()])
    }

    /// `nft` run inside the network namespace `name` (`ip netns exec`).
    pub fn in_netns(name: &str) -> Result<NftCli, NftError> {
        NftCli::with_prefix(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            name.into(),
            "nft".into(),
        ])
    }

    fn with_prefix(prefix: Vec<String>) -> Result<NftCli, NftError> {
        NftCli::with_runner(prefix, Arc::new(System))
    }

    /// `nft` run as `prefix` through `runner` (a fake one in tests).
    pub fn with_runner(prefix: Vec<String>, runner: Arc<dyn Runner>) -> Result<NftCli, NftError> {
        let mut cli = NftCli {
            prefix,
            version: (0, 0, 0),
            runner,
        };
        let out = cli.exec(&["--version"], None)?;
        cli.version = parse_version(&out)
            .ok_or_else(|| NftError::NftMissing(format!("unexpected version output {out:?}")))?;
        if cli.version < MIN_NFT_VERSION {
            return Err(NftError::NftTooOld(out.trim().to_owned()));
        }
        Ok(cli)
    }

    /// The version of nft in use.
    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    /// Checks a transaction without applying it (`nft --check`).
    pub fn check(&self, tx: &Transaction) -> Result<(), NftError> {
        if let Some(e) = tx.error() {
            return Err(e.clone());
        }
        self.exec(&["--check", "-f", "-"], Some(&tx.to_string()))
            .map(|_| ())
    }

    /// Runs one nft command line and returns its standard output.
    fn exec(&self, args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
        let (program, pre) = self
            .prefix
            .split_first()
            .ok_or_else(|| NftError::NftMissing("empty command".into()))?;
        let argv: Vec<&str> = pre
            .iter()
            .map(String::as_str)
            .chain(args.iter().copied())
            .collect();
        let out = self.runner.run(program, &argv, stdin).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) {
                NftError::NftMissing(format!("{}: {e}", self.prefix.join(" ")))
            } else {
                NftError::Refused(format!("running nft: {e}"))
            }
        })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        Err(classify(&stderr))
    }
}

/// Maps nft's error message to a typed error, keeping the message.
pub fn classify(stderr: &str) -> NftError {
    let msg = stderr.to_owned();
    if stderr.contains("No such file or directory") {
        NftError::NotFound(msg)
    } else if stderr.contains("File exists") {
        NftError::AlreadyExists(msg)
    } else if stderr.contains("Device or resource busy") {
        NftError::Busy(msg)
    } else if stderr.contains("Operation not permitted") || stderr.contains("Permission denied") {
        NftError::Refused(format!("{msg} (verdict needs CAP_NET_ADMIN)"))
    } else {
        NftError::Refused(msg)
    }
}

/// Reads `nftables v1.0.6 (Lester Gooch #5)`.
fn parse_version(out: &str) -> Option<(u32, u32, u32)> {
    let v = out.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut it = v.split('.').map(|n| n.parse::<u32>().ok());
    Some((
        it.next()??,
        it.next().flatten().unwrap_or(0),
        it.next().flatten().unwrap_or(0),
    ))
}

impl Backend for NftCli {
    fn check(&mut self, tx: &Transaction) -> Result<(), NftError> {
        NftCli::check(self, tx)
    }

    fn run(&mut self, tx: &Transaction) -> Result<(), NftError> {
        if let Some(e) = tx.error() {
            return Err(e.clone());
        }
        if tx.is_empty() {
            return Ok(());
        }
        self.exec(&["-f", "-"], Some(&tx.to_string())).map(|_| ())
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<TableState>, NftError> {
        match self.exec(&["-j", "list", "table", &family.to_string(), name], None) {
            Ok(json) => crate::json::parse_table(&json, family, name).map(Some),
            Err(NftError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn elements(
        &mut self,
        family: Family,
        table: &str,
        set: &str,
    ) -> Result<Vec<crate::ir::Element>, NftError> {
        let kind = match self.exec(
            &["-j", "list", "map", &family.to_string(), table, set],
            None,
        ) {
            Ok(json) => json,
            Err(NftError::NotFound(_)) | Err(NftError::Refused(_)) => self.exec(
                &["-j", "list", "set", &family.to_string(), table, set],
                None,
            )?,
            Err(e) => return Err(e),
        };
        let s = crate::json::parse_set_listing(&kind, family, table, set)?;
        Ok(s.elements.into_values().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tx::Transaction;

    #[test]
    fn reads_versions() {
        assert_eq!(
            parse_version("nftables v1.0.6 (Lester Gooch #5)\n"),
            Some((1, 0, 6))
        );
        assert_eq!(parse_version("nftables v1.1 (x)"), Some((1, 1, 0)));
        assert_eq!(parse_version("nftables v0.9.8 (E.D.S.)"), Some((0, 9, 8)));
        assert_eq!(parse_version("garbage"), None);
        assert!((0, 9, 8) < MIN_NFT_VERSION && (1, 0, 1) >= MIN_NFT_VERSION);
    }

    #[test]
    fn classifies_nft_errors() {
        let e = classify(
            "Error: Could not process rule: No such file or directory\ndelete chain ip verdict x",
        );
        assert!(e.is_not_found());
        assert!(e.to_string().contains("delete chain ip verdict x"));
        assert!(classify("Error: Could not process rule: File exists").is_already_exists());
        assert!(matches!(
            classify("Error: Could not process rule: Device or resource busy"),
            NftError::Busy(_)
        ));
        assert!(matches!(
            classify("Error: syntax error, unexpected junk"),
            NftError::Refused(_)
        ));
        assert!(
            classify("Operation not permitted")
                .to_string()
                .contains("CAP_NET_ADMIN")
        );
    }

    /// A fake nft: answers each command line from a script and records
    /// what it was asked and given.
    #[derive(Debug, Default)]
    struct Fake {
        calls: std::sync::Mutex<Vec<(Vec<String>, Option<String>)>>,
    }

    impl Runner for Fake {
        fn run(
            &self,
            _program: &str,
            args: &[&str],
            stdin: Option<&str>,
        ) -> std::io::Result<std::process::Output> {
            use std::os::unix::process::ExitStatusExt;
            self.calls.lock().unwrap().push((
                args.iter().map(|a| (*a).to_owned()).collect(),
                stdin.map(str::to_owned),
            ));
            let ok = |stdout: &str| std::process::Output {
                status: std::process::ExitStatus::from_raw(0),
                stdout: stdout.as_bytes().to_vec(),
                stderr: Vec::new(),
            };
            let fail = |stderr: &str| std::process::Output {
                status: std::process::ExitStatus::from_raw(1 << 8),
                stdout: Vec::new(),
                stderr: stderr.as_bytes().to_vec(),
            };
            Ok(match args {
                ["--version"] => ok("nftables v1.0.6 (Lester Gooch #5)\n"),
                ["-j", "list", "table", "ip", "missing"] => {
                    fail("Error: No such file or directory; did you mean table 'x'?")
                }
                ["-j", "list", "table", "ip", "t"] => ok(
                    r#"{"nftables": [{"metainfo": {"json_schema_version": 1}}, {"table": {"family": "ip", "name": "t", "handle": 1}}, {"chain": {"family": "ip", "table": "t", "name": "c", "handle": 2}}]}"#,
                ),
                ["-f", "-"] if stdin.is_some_and(|s| s.contains("busy")) => {
                    fail("Error: Could not process rule: Device or resource busy")
                }
                _ => ok(""),
            })
        }
    }

    #[test]
    fn transactions_go_to_nft_on_stdin_and_tables_come_back_parsed() {
        let fake = Arc::new(Fake::default());
        let mut nft = NftCli::with_runner(vec!["nft".into()], fake.clone()).unwrap();
        assert_eq!(nft.version(), (1, 0, 6));
        let mut tx = Transaction::new(Family::Ip, "t");
        tx.add_chain(crate::ir::Chain::regular("c"));
        nft.run(&tx).unwrap();
        Backend::check(&mut nft, &tx).unwrap();
        // An empty transaction runs nothing; one built with an error is
        // refused before nft is asked.
        nft.run(&Transaction::new(Family::Ip, "t")).unwrap();
        let mut bad = Transaction::new(Family::Ip, "t");
        bad.add_chain(crate::ir::Chain::regular(""));
        assert!(matches!(nft.run(&bad), Err(NftError::Invalid(_))));
        let calls = fake.calls.lock().unwrap().clone();
        let script = tx.to_string();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert_eq!(
            calls[1],
            (vec!["-f".into(), "-".into()], Some(script.clone()))
        );
        assert_eq!(
            calls[2],
            (
                vec!["--check".into(), "-f".into(), "-".into()],
                Some(script)
            )
        );

        let t = nft.table(Family::Ip, "t").unwrap().unwrap();
        assert!(t.chains.contains_key("c"));
        assert_eq!(nft.table(Family::Ip, "missing").unwrap(), None);
        let mut busy = Transaction::new(Family::Ip, "t");
        busy.add_chain(crate::ir::Chain::regular("busy"));
        assert!(matches!(nft.run(&busy), Err(NftError::Busy(_))));
    }

    #[test]
    fn missing_program_is_reported() {
        let err = NftCli::with_prefix(vec!["/nonexistent/nft".into()]).unwrap_err();
        assert!(matches!(err, NftError::NftMissing(_)), "{err}");
    }
}

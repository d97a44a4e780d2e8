//! XS_CONTROL (`xenstore-control`): the commands of C xenstored 4.17 that
//! make sense here: `check`, `log`, `print`, `quota`, `help`.

use super::Store;
use crate::error::XsError;

const COMMANDS: [(&str, &str); 5] = [
    ("check", ""),
    ("log", "on|off"),
    ("print", "<string>"),
    ("quota", "[set <name> <val>|<domid>]"),
    ("help", ""),
];

fn text(s: String) -> Vec<u8> {
    let mut v = s.into_bytes();
    v.push(0);
    v
}

impl Store {
    pub(super) fn control(&mut self, cmd: &str, args: &[String]) -> Result<Vec<u8>, XsError> {
        match (cmd, args.len()) {
            ("check", 0) => {
                self.check_consistency().map_err(|why| {
                    tracing::error!("xenstore consistency check failed: {why}");
                    XsError::Eio
                })?;
                Ok(super::ops::ok())
            }
            ("log", 1) => {
                self.log_requests = match args[0].as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(XsError::Einval),
                };
                Ok(super::ops::ok())
            }
            ("print", _) => {
                tracing::info!("control print: {}", args.join(" "));
                Ok(super::ops::ok())
            }
            ("quota", 0) => {
                let mut s = String::from("Quota settings:\n");
                for (name, val, descr) in self.quotas.table() {
                    s += &format!("{name:<17}: {val:>8} {descr}\n");
                }
                Ok(text(s))
            }
            ("quota", 3) if args[0] == "set" => {
                let val: usize = args[2].parse().map_err(|_| XsError::Einval)?;
                if self.quotas.set(&args[1], val) {
                    Ok(super::ops::ok())
                } else {
                    Err(XsError::Einval)
                }
            }
            ("quota", 1) => {
                let domid: u16 = args[0].parse().map_err(|_| XsError::Einval)?;
                if !self.domains.is_introduced(domid) && self.acct.entries(domid) == 0 {
                    return Err(XsError::Enoent);
                }
                let (watches, txns, conns) = self.domain_usage(domid);
                let mut s = format!("Domain {domid}:\n");
                s += &format!("{:<16}: {:>8}\n", "nodes", self.acct.entries(domid));
                s += &format!("{:<16}: {watches:>8}\n", "watches");
                s += &format!("{:<16}: {txns:>8}\n", "transactions");
                s += &format!("{:<16}: {conns:>8}\n", "connections");
                Ok(text(s))
            }
            ("help", 0) => {
                let mut s = String::new();
                for (c, pars) in COMMANDS {
                    s += &format!("{c}\t{pars}\n");
                }
                Ok(text(s))
            }
            _ => Err(XsError::Einval),
        }
    }
}

//! `pvio internal guest-shell`: a guest domain that obeys commands read one
//! per line on stdin and answers one line each on stdout. Tests use it to
//! play a well-behaved or hostile guest in its own process; it is also handy
//! for poking at hvd by hand.
//!
//! Commands (answers start with `ok` or `err`):
//!
//! ```text
//! domid                         -> ok <domid>
//! write <gfn> <offset> <text>   -> ok
//! read <gfn> <offset> <len>     -> ok <text>
//! grant <domid> <gfn> <ro|rw>   -> ok <ref>
//! grant-ref <ref> <domid> <gfn> <ro|rw> -> ok
//! raw-entry <ref> <hex u64>     -> ok          (hostile: store any entry)
//! end <ref>                     -> ok | err in-use ...
//! mapped <ref>                  -> ok <0|1>
//! entry <ref>                   -> ok <flags> <domid> <frame>
//! unbound <remote-domid>        -> ok <port>
//! bind <remote-domid> <port>    -> ok <port>
//! notify <port>                 -> ok
//! notify-store                  -> ok          (the xenstore event channel)
//! wait <port> <timeout-ms>      -> ok event | ok timeout
//! close <port>                  -> ok
//! status <port>                 -> ok <state> <remote-dom> <remote-port>
//! abort                         -> (dies without cleaning up)
//! exit                          -> ok, then exits
//! ```

use std::collections::HashMap;
use std::io::{BufRead, Write};

use anyhow::{anyhow, bail, Context};
use clap::Args as ClapArgs;
use pvio_hv::{EventChannel, GuestDomain, HvClient};

/// Options of `pvio internal guest-shell`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// hvd's socket.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub socket: std::path::PathBuf,
    /// Domain name.
    #[arg(long, default_value = "guest-shell")]
    pub name: String,
    /// Memory in 4 KiB frames.
    #[arg(long, default_value_t = 256)]
    pub frames: u32,
    /// Claim this domain (created by the toolstack) instead of creating one.
    #[arg(long, requires = "token")]
    pub domid: Option<u16>,
    /// Claim token for --domid.
    #[arg(long)]
    pub token: Option<u64>,
}

struct Shell {
    dom: GuestDomain,
    channels: HashMap<u32, EventChannel>,
}

fn num<T: std::str::FromStr>(w: Option<&str>, what: &str) -> anyhow::Result<T> {
    w.ok_or_else(|| anyhow!("missing {what}"))?
        .parse()
        .map_err(|_| anyhow!("bad {what}"))
}

fn ro(w: Option<&str>) -> anyhow::Result<bool> {
    match w {
        Some("ro") => Ok(true),
        Some("rw") => Ok(false),
        _ => bail!("expected ro or rw"),
    }
}

impl Shell {
    fn chan(&self, port: u32) -> anyhow::Result<&EventChannel> {
        self.channels
            .get(&port)
            .ok_or_else(|| anyhow!("port {port} is not open here"))
    }

    fn exec(&mut self, line: &str) -> anyhow::Result<String> {
        let mut w = line.split_whitespace();
        let cmd = w.next().unwrap_or("");
        Ok(match cmd {
            "domid" => self.dom.client.domid().to_string(),
            "write" => {
                let gfn = num(w.next(), "gfn")?;
                let off = num(w.next(), "offset")?;
                let text = w.collect::<Vec<_>>().join(" ");
                self.dom.memory.write(gfn, off, text.as_bytes())?;
                String::new()
            }
            "read" => {
                let gfn = num(w.next(), "gfn")?;
                let off = num(w.next(), "offset")?;
                let len: usize = num(w.next(), "len")?;
                let mut buf = vec![0u8; len.min(4096)];
                self.dom.memory.read(gfn, off, &mut buf)?;
                String::from_utf8_lossy(&buf).into_owned()
            }
            "grant" => {
                let domid = num(w.next(), "domid")?;
                let gfn = num(w.next(), "gfn")?;
                let r = self.dom.grants.grant_access(domid, gfn, ro(w.next())?)?;
                r.to_string()
            }
            "grant-ref" => {
                let r = num(w.next(), "ref")?;
                let domid = num(w.next(), "domid")?;
                let gfn = num(w.next(), "gfn")?;
                self.dom
                    .grants
                    .grant_access_ref(r, domid, gfn, ro(w.next())?)?;
                String::new()
            }
            "raw-entry" => {
                let r = num(w.next(), "ref")?;
                let v = u64::from_str_radix(w.next().unwrap_or(""), 16).context("hex entry")?;
                self.dom.grants.raw().store(r, v)?;
                String::new()
            }
            "end" => {
                self.dom.grants.end_access(num(w.next(), "ref")?)?;
                String::new()
            }
            "entry" => {
                let r = num(w.next(), "ref")?;
                let e = self
                    .dom
                    .grants
                    .entry(r)
                    .ok_or_else(|| anyhow!("ref {r} out of range"))?;
                format!("{} {} {}", e.flags, e.domid, e.frame)
            }
            "mapped" => u8::from(self.dom.grants.is_mapped(num(w.next(), "ref")?)).to_string(),
            "unbound" => {
                let c = self
                    .dom
                    .client
                    .evtchn_alloc_unbound(num(w.next(), "domid")?)?;
                let p = c.port();
                self.channels.insert(p, c);
                p.to_string()
            }
            "bind" => {
                let d = num(w.next(), "domid")?;
                let rp = num(w.next(), "port")?;
                let c = self.dom.client.evtchn_bind_interdomain(d, rp)?;
                let p = c.port();
                self.channels.insert(p, c);
                p.to_string()
            }
            "notify-store" => {
                self.dom.store.notify()?;
                String::new()
            }
            "notify" => {
                self.chan(num(w.next(), "port")?)?.notify()?;
                String::new()
            }
            "wait" => {
                let c = self.chan(num(w.next(), "port")?)?;
                let ms: u64 = num(w.next(), "timeout")?;
                if c.wait_timeout(std::time::Duration::from_millis(ms))? {
                    "event".into()
                } else {
                    "timeout".into()
                }
            }
            "close" => {
                let p = num(w.next(), "port")?;
                self.dom.client.evtchn_close(p)?;
                self.channels.remove(&p);
                String::new()
            }
            "status" => {
                let s = self
                    .dom
                    .client
                    .evtchn_status(self.dom.client.domid(), num(w.next(), "port")?)?;
                format!("{} {} {}", s.state.name(), s.remote_dom, s.remote_port)
            }
            "abort" => std::process::abort(),
            other => bail!("unknown command {other:?}"),
        })
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dom = match (args.domid, args.token) {
        (Some(d), Some(t)) => HvClient::claim_domain(&args.socket, d, t)?,
        _ => HvClient::register_guest(&args.socket, &args.name, args.frames)?,
    };
    let mut shell = Shell {
        dom,
        channels: HashMap::new(),
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim() == "exit" {
            writeln!(out, "ok")?;
            break;
        }
        match shell.exec(&line) {
            Ok(s) if s.is_empty() => writeln!(out, "ok")?,
            Ok(s) => writeln!(out, "ok {s}")?,
            Err(e) => writeln!(out, "err {e:#}")?,
        }
        out.flush()?;
    }
    Ok(())
}

//! `pvio internal xs-guest`: a guest that claims its domain from hvd and
//! talks to xenstored over its own xenbus ring (`Client::connect_ring`),
//! driven one command per line on stdin with one answer line each on
//! stdout. Tests use it to play a well-behaved or hostile guest.
//!
//! Answers start with `ok` or `err`; a xenstore error is its Xen name
//! (`err EACCES`).
//!
//! ```text
//! domid                          -> ok <domid>
//! read <path>                    -> ok <value>
//! write <path> <value>           -> ok
//! mkdir <path> | rm <path>       -> ok
//! dir <path>                     -> ok <child> <child> ...
//! perms <path>                   -> ok <perm> <perm> ...
//! setperms <path> <perm>...      -> ok
//! domain-path                    -> ok /local/domain/<domid>
//! introduced <domid>             -> ok T|F            (dom0 only: EACCES)
//! watch <path>                   -> ok <id>           (first event consumed)
//! event <id> <timeout-ms>        -> ok <path> | err timeout
//! unwatch <id>                   -> ok
//! tx-start                       -> ok <tx>
//! tx-read <tx> <path>            -> ok <value>
//! tx-write <tx> <path> <value>   -> ok
//! tx-commit <tx> | tx-abort <tx> -> ok | err EAGAIN ...
//! incr <path>                    -> ok <n>            (retrying transaction)
//! fill <dir> <n>                 -> ok <created> <first error or none>
//! ring-error | ring-features     -> ok <value>        (words of the ring page)
//! hostile-index                  -> ok                (req_prod far ahead)
//! hostile-length                 -> ok                (a 100000-byte header)
//! exit                           -> ok, then exits
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::Args as ClapArgs;
use pvio_hv::{EventChannel, HvClient};
use pvio_ring::GuestPages;
use pvio_xenstore::codec::{encode_message, MsgType};
use pvio_xenstore::ring::{End, Field, XenbusRing};
use pvio_xenstore::{Client, Perms, Watcher};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Options of `pvio internal xs-guest`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// hvd's socket.
    #[arg(long, env = "PVIO_HVD_SOCKET", default_value = "/run/pvio/hvd.sock")]
    pub socket: std::path::PathBuf,
    /// The domain to claim (created by the toolstack).
    #[arg(long)]
    pub domid: u16,
    /// Its claim token.
    #[arg(long)]
    pub token: u64,
}

struct Shell {
    domid: u16,
    client: Client,
    /// Raw access to the ring page, for the hostile commands.
    page: GuestPages,
    /// Notifies xenstored (a second handle on the store channel's descriptors).
    bell: EventChannel,
    watches: HashMap<u32, Watcher>,
    next_watch: u32,
}

fn arg<'a>(w: &mut impl Iterator<Item = &'a str>, what: &str) -> anyhow::Result<&'a str> {
    w.next().ok_or_else(|| anyhow!("missing {what}"))
}

fn num<T: std::str::FromStr>(w: Option<&str>, what: &str) -> anyhow::Result<T> {
    w.ok_or_else(|| anyhow!("missing {what}"))?
        .parse()
        .map_err(|_| anyhow!("bad {what}"))
}

fn path0(p: &str) -> Vec<u8> {
    let mut v = p.as_bytes().to_vec();
    v.push(0);
    v
}

impl Shell {
    fn raw_ring(&self) -> anyhow::Result<XenbusRing<GuestPages>> {
        Ok(XenbusRing::attach(self.page.clone(), End::Guest)?)
    }

    async fn exec(&mut self, line: &str) -> anyhow::Result<String> {
        let mut w = line.split_whitespace();
        let cmd = w.next().unwrap_or("");
        let c = &self.client;
        Ok(match cmd {
            "domid" => self.domid.to_string(),
            "read" => c.read_string(arg(&mut w, "path")?).await?,
            "write" => {
                let p = arg(&mut w, "path")?;
                c.write(p, w.collect::<Vec<_>>().join(" ")).await?;
                String::new()
            }
            "mkdir" => {
                c.mkdir(arg(&mut w, "path")?).await?;
                String::new()
            }
            "rm" => {
                c.rm(arg(&mut w, "path")?).await?;
                String::new()
            }
            "dir" => c.directory(arg(&mut w, "path")?).await?.join(" "),
            "perms" => c.get_perms(arg(&mut w, "path")?).await?.to_string(),
            "setperms" => {
                let p = arg(&mut w, "path")?;
                let perms = Perms::parse(w.map(str::as_bytes))?;
                c.set_perms(p, &perms).await?;
                String::new()
            }
            "domain-path" => c.get_domain_path(self.domid).await?,
            "introduced" => {
                let yes = c.is_domain_introduced(num(w.next(), "domid")?).await?;
                if yes { "T" } else { "F" }.to_string()
            }
            "watch" => {
                let mut watcher = c.watch(arg(&mut w, "path")?).await?;
                // The event every new watch fires at once.
                tokio::time::timeout(Duration::from_secs(20), watcher.next())
                    .await
                    .context("no initial watch event")?;
                let id = self.next_watch;
                self.next_watch += 1;
                self.watches.insert(id, watcher);
                id.to_string()
            }
            "event" => {
                let id: u32 = num(w.next(), "watch id")?;
                let ms: u64 = num(w.next(), "timeout")?;
                let watcher = self
                    .watches
                    .get_mut(&id)
                    .ok_or_else(|| anyhow!("no watch {id}"))?;
                match tokio::time::timeout(Duration::from_millis(ms), watcher.next()).await {
                    Ok(Some(ev)) => ev.path,
                    Ok(None) => bail!("connection closed"),
                    Err(_) => bail!("timeout"),
                }
            }
            "unwatch" => {
                let id: u32 = num(w.next(), "watch id")?;
                let watcher = self
                    .watches
                    .remove(&id)
                    .ok_or_else(|| anyhow!("no watch {id}"))?;
                watcher.unwatch().await?;
                String::new()
            }
            "tx-start" => {
                let r = c.request(MsgType::TransactionStart, 0, b"\0").await?;
                String::from_utf8_lossy(r.strip_suffix(b"\0").unwrap_or(&r)).into_owned()
            }
            "tx-read" => {
                let tx = num(w.next(), "tx")?;
                let r = c
                    .request(MsgType::Read, tx, &path0(arg(&mut w, "path")?))
                    .await?;
                String::from_utf8_lossy(&r).into_owned()
            }
            "tx-write" => {
                let tx = num(w.next(), "tx")?;
                let mut p = path0(arg(&mut w, "path")?);
                p.extend_from_slice(w.collect::<Vec<_>>().join(" ").as_bytes());
                c.request(MsgType::Write, tx, &p).await?;
                String::new()
            }
            "tx-commit" | "tx-abort" => {
                let tx = num(w.next(), "tx")?;
                let how: &[u8] = if cmd == "tx-commit" { b"T\0" } else { b"F\0" };
                c.request(MsgType::TransactionEnd, tx, how).await?;
                String::new()
            }
            "incr" => {
                let p = arg(&mut w, "path")?;
                let n = c
                    .transaction(async |t| {
                        let v: u64 = match t.try_read(p).await? {
                            Some(v) => String::from_utf8_lossy(&v).parse().unwrap_or(0),
                            None => 0,
                        };
                        t.write(p, (v + 1).to_string()).await?;
                        Ok(v + 1)
                    })
                    .await?;
                n.to_string()
            }
            "fill" => {
                let dir = arg(&mut w, "dir")?;
                let n: u32 = num(w.next(), "count")?;
                let mut made = 0;
                let mut first_err = "none".to_string();
                for i in 0..n {
                    match c.write(&format!("{dir}/n{i}"), "x").await {
                        Ok(()) => made += 1,
                        Err(e) => {
                            first_err = e.xs().map_or(e.to_string(), |x| x.name().to_string());
                            break;
                        }
                    }
                }
                format!("{made} {first_err}")
            }
            "ring-error" => self.raw_ring()?.load(Field::Error).to_string(),
            "ring-features" => self.raw_ring()?.load(Field::ServerFeatures).to_string(),
            "hostile-index" => {
                let ring = self.raw_ring()?;
                let cons = ring.load(Field::ReqCons);
                ring.store(Field::ReqProd, cons.wrapping_add(5000));
                self.bell.notify()?;
                String::new()
            }
            "hostile-length" => {
                let mut ring = self.raw_ring()?;
                let mut hdr = Vec::new();
                encode_message(&mut hdr, MsgType::Write as u32, 1, 0, b"");
                hdr[12..16].copy_from_slice(&100_000u32.to_ne_bytes());
                if ring.write(&hdr)? != hdr.len() {
                    bail!("request ring full");
                }
                self.bell.notify()?;
                String::new()
            }
            other => bail!("unknown command {other:?}"),
        })
    }
}

fn answer(r: anyhow::Result<String>) -> String {
    match r {
        Ok(s) if s.is_empty() => "ok".into(),
        Ok(s) => format!("ok {s}"),
        Err(e) => match e
            .downcast_ref::<pvio_xenstore::Error>()
            .and_then(|x| x.xs())
        {
            Some(x) => format!("err {}", x.name()),
            None => format!("err {e:#}"),
        },
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let pvio_hv::GuestDomain {
        client: hv,
        memory,
        store,
        ..
    } = HvClient::claim_domain(&args.socket, args.domid, args.token)?;
    let bell = EventChannel::from_fds(
        store.port(),
        store.remote_dom(),
        store.wait_fd().try_clone_to_owned()?,
        store.notify_fd().try_clone_to_owned()?,
    );
    let page = GuestPages::new(Arc::clone(&memory), pvio_hv::memory::STORE_FRAME, 1)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = Client::connect_ring(memory, store).await?;
        let mut shell = Shell {
            domid: hv.domid(),
            client,
            page,
            bell,
            watches: HashMap::new(),
            next_watch: 1,
        };
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut out = tokio::io::stdout();
        while let Some(line) = lines.next_line().await? {
            let exit = line.trim() == "exit";
            let reply = if exit {
                "ok".to_string()
            } else {
                answer(shell.exec(&line).await)
            };
            out.write_all(format!("{reply}\n").as_bytes()).await?;
            out.flush().await?;
            if exit {
                break;
            }
        }
        anyhow::Ok(())
    })?;
    // The hv connection is the domain: it goes when the process does.
    drop(hv);
    Ok(())
}

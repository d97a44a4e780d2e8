//! Watch registrations, indexed by watched path so that a change at `p`
//! finds its watches by looking up `p` and its ancestors (C xenstored scans
//! every watch of every connection instead).

use super::ConnId;
use std::collections::HashMap;

/// One registered watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEntry {
    pub conn: ConnId,
    pub token: Vec<u8>,
    /// Registered with a relative path: events report paths relative to the
    /// connection's domain home.
    pub relative: bool,
}

/// All watches of all connections.
#[derive(Debug, Default)]
pub struct Watches {
    /// Watched path (absolute or `@special`) → registrations.
    by_path: HashMap<String, Vec<WatchEntry>>,
    /// Connection → its (path, token) pairs, for removal and counting.
    by_conn: HashMap<ConnId, Vec<(String, Vec<u8>)>>,
}

impl Watches {
    /// Whether `conn` already watches `path` with `token`.
    pub fn contains(&self, conn: ConnId, path: &str, token: &[u8]) -> bool {
        self.by_conn
            .get(&conn)
            .is_some_and(|v| v.iter().any(|(p, t)| p == path && t == token))
    }

    /// Number of watches `conn` holds.
    pub fn count(&self, conn: ConnId) -> usize {
        self.by_conn.get(&conn).map_or(0, Vec::len)
    }

    /// Total number of watches.
    pub fn total(&self) -> usize {
        self.by_conn.values().map(Vec::len).sum()
    }

    /// Registers a watch (the caller has checked for duplicates).
    pub fn add(&mut self, conn: ConnId, path: String, token: Vec<u8>, relative: bool) {
        self.by_conn
            .entry(conn)
            .or_default()
            .push((path.clone(), token.clone()));
        self.by_path.entry(path).or_default().push(WatchEntry {
            conn,
            token,
            relative,
        });
    }

    /// Removes one watch; false if there was none.
    pub fn remove(&mut self, conn: ConnId, path: &str, token: &[u8]) -> bool {
        let Some(list) = self.by_conn.get_mut(&conn) else {
            return false;
        };
        let Some(i) = list.iter().position(|(p, t)| p == path && t == token) else {
            return false;
        };
        list.remove(i);
        if list.is_empty() {
            self.by_conn.remove(&conn);
        }
        self.unindex(conn, path, token);
        true
    }

    fn unindex(&mut self, conn: ConnId, path: &str, token: &[u8]) {
        if let Some(v) = self.by_path.get_mut(path) {
            if let Some(i) = v.iter().position(|w| w.conn == conn && w.token == token) {
                v.remove(i);
            }
            if v.is_empty() {
                self.by_path.remove(path);
            }
        }
    }

    /// Removes every watch of a connection.
    pub fn remove_conn(&mut self, conn: ConnId) {
        if let Some(list) = self.by_conn.remove(&conn) {
            for (p, t) in list {
                self.unindex(conn, &p, &t);
            }
        }
    }

    /// The watches registered exactly on `path`.
    pub fn on(&self, path: &str) -> &[WatchEntry] {
        self.by_path.get(path).map_or(&[], Vec::as_slice)
    }
}

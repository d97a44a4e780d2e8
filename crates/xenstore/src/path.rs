//! Node paths: validation, relative → absolute, and the tree relations the
//! store and watches need. Mirrors `is_valid_nodename()`, `canonicalize()`
//! and `is_child()` of C xenstored 4.17 (docs/misc/xenstore.txt §5.1).

use pvio_abi::DomId;
use std::borrow::Cow;

/// Where every domain's home directory lives.
pub const LOCAL_DOMAIN: &str = "/local/domain";

/// `/local/domain/<domid>`: the home of a domain and the base of its relative paths.
pub fn domain_path(domid: DomId) -> String {
    format!("{LOCAL_DOMAIN}/{domid}")
}

/// Turns a path as a client sent it into the absolute form: absolute paths
/// and special (`@...`) names are kept, relative ones are prefixed with the
/// connection's domain path.
pub fn canonicalize(domid: DomId, path: &str) -> Cow<'_, str> {
    if path.starts_with('/') || path.starts_with('@') {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(format!("{LOCAL_DOMAIN}/{domid}/{path}"))
    }
}

/// Characters allowed in a node path.
fn valid_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'@')
}

/// Length of a `/local/domain/<digits>/` prefix, which does not count
/// against the path-length quota, or 0.
fn local_prefix_len(path: &str) -> usize {
    let Some(rest) = path.strip_prefix("/local/domain/") else {
        return 0;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if (1..=5).contains(&digits) && rest.as_bytes().get(digits) == Some(&b'/') {
        "/local/domain/".len() + digits + 1
    } else {
        0
    }
}

/// Whether `path` is a valid absolute node path: starts with `/`, no trailing
/// `/` except for the root, no `//`, only `[A-Za-z0-9-/_@]`, and at most
/// `max_len` bytes after any `/local/domain/<d>/` prefix (the `path-max`
/// quota, itself at most `XENSTORE_REL_PATH_MAX`).
pub fn is_valid_nodename(path: &str, max_len: usize) -> bool {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    if b.len() > 1 && b[b.len() - 1] == b'/' {
        return false;
    }
    if path.contains("//") {
        return false;
    }
    if b.len() > local_prefix_len(path) + max_len {
        return false;
    }
    b.iter().all(|c| valid_char(*c))
}

/// Whether `child` is `parent` or below it. Every path is below `/`.
pub fn is_child(child: &str, parent: &str) -> bool {
    if parent == "/" {
        return true;
    }
    match child.strip_prefix(parent) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The parent of a valid absolute path; the root is its own parent.
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last component of a valid absolute path other than the root.
pub fn basename(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

/// `parent/name`, without doubling the root's slash.
pub fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The form of an event path a relative watch reports: the path with the
/// domain prefix (and the slash after it) removed.
pub fn relative_to<'a>(path: &'a str, base: &str) -> &'a str {
    match path.strip_prefix(base) {
        Some(rest) => rest.strip_prefix('/').unwrap_or(rest),
        None => path,
    }
}

/// Iterates `path`, its parent, and so on up to and including `/`.
pub fn ancestors_inclusive(path: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(path);
    std::iter::from_fn(move || {
        let cur = next?;
        next = if cur == "/" { None } else { Some(parent(cur)) };
        Some(cur)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity() {
        let m = 2048;
        assert!(is_valid_nodename("/", m));
        assert!(is_valid_nodename("/a/b-c_d@e/9", m));
        assert!(!is_valid_nodename("", m));
        assert!(!is_valid_nodename("a/b", m));
        assert!(!is_valid_nodename("/a/", m));
        assert!(!is_valid_nodename("/a//b", m));
        assert!(!is_valid_nodename("/a b", m));
        assert!(!is_valid_nodename("/a.b", m));
        assert!(!is_valid_nodename("/a\u{e9}", m));
        let long = format!("/{}", "x".repeat(2047));
        assert!(is_valid_nodename(&long, m));
        assert!(!is_valid_nodename(&format!("{long}x"), m));
        // The domain prefix does not count.
        let dom = format!("/local/domain/12/{}", "y".repeat(2048));
        assert!(is_valid_nodename(&dom, m));
        assert!(!is_valid_nodename(&format!("{dom}y"), m));
        assert!(!is_valid_nodename(&long, 100));
    }

    #[test]
    fn relations() {
        assert!(is_child("/a/b", "/a"));
        assert!(is_child("/a", "/a"));
        assert!(!is_child("/ab", "/a"));
        assert!(is_child("/anything", "/"));
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("/"), "/");
        assert_eq!(basename("/a/bc"), "bc");
        assert_eq!(child_path("/", "x"), "/x");
        assert_eq!(child_path("/a", "x"), "/a/x");
        assert_eq!(canonicalize(3, "x/y"), "/local/domain/3/x/y");
        assert_eq!(canonicalize(3, "/x"), "/x");
        assert_eq!(canonicalize(3, "@releaseDomain"), "@releaseDomain");
        assert_eq!(relative_to("/local/domain/3/x", "/local/domain/3"), "x");
        assert_eq!(relative_to("/local/domain/3", "/local/domain/3"), "");
        let a: Vec<_> = ancestors_inclusive("/a/b/c").collect();
        assert_eq!(a, ["/a/b/c", "/a/b", "/a", "/"]);
    }
}

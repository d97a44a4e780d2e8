/*
 * Drives `pvio xenstored` through Xen's own libxenstore (found via
 * XENSTORED_PATH): reads and writes, a long directory, permissions,
 * transactions including a conflict that must give EAGAIN and succeed on
 * retry, watches (including one fired by a committed transaction), and the
 * domain introduction calls. Prints one line per check; exits non-zero on
 * the first failure.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xenstore.h>

#define CHECK(cond, what)                                                     \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "FAIL: %s (errno %d: %s)\n", what, errno,         \
                    strerror(errno));                                         \
            exit(1);                                                          \
        }                                                                     \
        printf("ok: %s\n", what);                                             \
    } while (0)

static bool read_is(struct xs_handle *h, xs_transaction_t t, const char *path,
                    const char *want)
{
    unsigned int len;
    char *v = xs_read(h, t, path, &len);
    bool ok = v && len == strlen(want) && memcmp(v, want, len) == 0;
    free(v);
    return ok;
}

/* Next watch event must be for `path` with `token`. */
static bool event_is(struct xs_handle *h, const char *path, const char *token)
{
    unsigned int num;
    char **vec = xs_read_watch(h, &num);
    bool ok = vec && num >= 2 && strcmp(vec[XS_WATCH_PATH], path) == 0 &&
              strcmp(vec[XS_WATCH_TOKEN], token) == 0;
    if (vec && !ok)
        fprintf(stderr, "event: %s %s\n", vec[XS_WATCH_PATH], vec[XS_WATCH_TOKEN]);
    free(vec);
    return ok;
}

int main(void)
{
    struct xs_handle *h = xs_open(0), *h2 = xs_open(0), *hw = xs_open(0);
    CHECK(h && h2 && hw, "xs_open via XENSTORED_PATH");

    CHECK(xs_write(h, XBT_NULL, "/c/test/leaf", "value", 5), "write creates parents");
    CHECK(read_is(h, XBT_NULL, "/c/test/leaf", "value"), "read back");
    CHECK(read_is(h2, XBT_NULL, "/c/test", ""), "created parent is empty");
    errno = 0;
    CHECK(!xs_read(h, XBT_NULL, "/c/missing", NULL) && errno == ENOENT, "missing node: ENOENT");
    CHECK(xs_mkdir(h, XBT_NULL, "/c/dir"), "mkdir");

    /* A directory longer than one message: libxenstore falls back to
     * XS_DIRECTORY_PART on E2BIG. */
    char path[256];
    for (int i = 0; i < 200; i++) {
        snprintf(path, sizeof(path), "/c/big/child-with-a-longish-name-%03d", i);
        CHECK(xs_write(h, XBT_NULL, path, "", 0) || (i = 999, 0), "big directory entry");
    }
    unsigned int num;
    char **dir = xs_directory(h, XBT_NULL, "/c/big", &num);
    CHECK(dir && num == 200 && strcmp(dir[0], "child-with-a-longish-name-000") == 0 &&
              strcmp(dir[199], "child-with-a-longish-name-199") == 0,
          "xs_directory of 200 long names (XS_DIRECTORY_PART)");
    free(dir);

    /* Permissions. */
    struct xs_permissions perms[2] = {{.id = 0, .perms = XS_PERM_NONE},
                                      {.id = 5, .perms = XS_PERM_READ}};
    CHECK(xs_set_permissions(h, XBT_NULL, "/c/test/leaf", perms, 2), "set permissions");
    struct xs_permissions *got = xs_get_permissions(h, XBT_NULL, "/c/test/leaf", &num);
    CHECK(got && num == 2 && got[1].id == 5 && got[1].perms == XS_PERM_READ, "get permissions");
    free(got);

    /* Watches: fire once on registration, then on changes below. */
    CHECK(xs_watch(hw, "/c/w", "tok"), "watch");
    CHECK(event_is(hw, "/c/w", "tok"), "initial watch event");
    CHECK(xs_write(h2, XBT_NULL, "/c/w/x", "1", 1), "write under the watch");
    CHECK(event_is(hw, "/c/w/x", "tok"), "watch event for the change");

    /* Transaction conflict: h reads, h2 changes the node, h's commit must
     * fail with EAGAIN; the retry succeeds. */
    CHECK(xs_write(h, XBT_NULL, "/c/counter", "0", 1), "counter");
    xs_transaction_t t = xs_transaction_start(h);
    CHECK(t != XBT_NULL, "transaction start");
    CHECK(read_is(h, t, "/c/counter", "0"), "read in transaction");
    CHECK(xs_write(h2, XBT_NULL, "/c/counter", "100", 3), "concurrent write");
    CHECK(xs_write(h, t, "/c/counter", "1", 1), "write in transaction");
    CHECK(read_is(h2, XBT_NULL, "/c/counter", "100"), "transaction is isolated");
    errno = 0;
    CHECK(!xs_transaction_end(h, t, false) && errno == EAGAIN, "conflicting commit: EAGAIN");
    CHECK(read_is(h, XBT_NULL, "/c/counter", "100"), "failed commit changed nothing");
    t = xs_transaction_start(h);
    CHECK(read_is(h, t, "/c/counter", "100"), "retry reads the new value");
    CHECK(xs_write(h, t, "/c/counter", "101", 3), "retry writes");
    CHECK(xs_write(h, t, "/c/w/in-tx", "y", 1), "transaction writes under the watch");
    CHECK(xs_transaction_end(h, t, false), "retry commits");
    CHECK(read_is(h2, XBT_NULL, "/c/counter", "101"), "committed value visible");
    CHECK(event_is(hw, "/c/w/in-tx", "tok"), "transaction's watch event at commit");

    /* Abort. */
    t = xs_transaction_start(h);
    CHECK(xs_write(h, t, "/c/counter", "999", 3), "write in aborted transaction");
    CHECK(xs_transaction_end(h, t, true), "abort");
    CHECK(read_is(h, XBT_NULL, "/c/counter", "101"), "abort discards");

    /* Repeatable reads (C xenstored since 4.9): a transaction keeps its
     * own copy of every node it has touched, whatever others commit. */
    CHECK(xs_write(h, XBT_NULL, "/c/rr/a", "1", 1), "rr: node a");
    CHECK(xs_write(h, XBT_NULL, "/c/rr/b", "2", 1), "rr: node b");
    t = xs_transaction_start(h);
    CHECK(t != XBT_NULL, "rr: transaction start");
    CHECK(read_is(h, t, "/c/counter", "101"), "rr: first read");
    dir = xs_directory(h, t, "/c/rr", &num);
    CHECK(dir && num == 2, "rr: listing in the transaction");
    free(dir);
    CHECK(read_is(h, t, "/c/rr/a", "1"), "rr: read a");
    got = xs_get_permissions(h, t, "/c/test/leaf", &num);
    CHECK(got && num == 2, "rr: permissions in the transaction");
    free(got);
    CHECK(xs_write(h2, XBT_NULL, "/c/counter", "202", 3), "rr: value changed outside");
    CHECK(xs_rm(h2, XBT_NULL, "/c/rr/a"), "rr: node removed outside");
    CHECK(xs_write(h2, XBT_NULL, "/c/rr/c", "3", 1), "rr: node added outside");
    CHECK(xs_set_permissions(h2, XBT_NULL, "/c/test/leaf", perms, 1),
          "rr: permissions changed outside");
    CHECK(read_is(h, t, "/c/counter", "101"), "rr: second read sees the transaction's copy");
    dir = xs_directory(h, t, "/c/rr", &num);
    CHECK(dir && num == 2 && strcmp(dir[0], "a") == 0 && strcmp(dir[1], "b") == 0,
          "rr: listing unchanged inside");
    free(dir);
    CHECK(read_is(h, t, "/c/rr/a", "1"), "rr: node removed outside still reads inside");
    got = xs_get_permissions(h, t, "/c/test/leaf", &num);
    CHECK(got && num == 2 && got[1].id == 5, "rr: permissions unchanged inside");
    free(got);
    CHECK(read_is(h2, XBT_NULL, "/c/counter", "202"), "rr: outside sees the new value");
    errno = 0;
    CHECK(!xs_transaction_end(h, t, false) && errno == EAGAIN, "rr: commit fails with EAGAIN");

    /* Domains and special watches. */
    CHECK(xs_watch(hw, "@introduceDomain", "intro"), "watch @introduceDomain");
    CHECK(event_is(hw, "@introduceDomain", "intro"), "initial @introduceDomain event");
    CHECK(xs_watch(hw, "@releaseDomain", "rel"), "watch @releaseDomain");
    CHECK(event_is(hw, "@releaseDomain", "rel"), "initial @releaseDomain event");
    CHECK(!xs_is_domain_introduced(h, 5), "domain 5 not introduced");
    CHECK(xs_introduce_domain(h, 5, 0x1234, 7), "introduce domain 5");
    CHECK(event_is(hw, "@introduceDomain", "intro"), "@introduceDomain fires");
    CHECK(xs_is_domain_introduced(h, 5), "domain 5 introduced");
    char *dp = xs_get_domain_path(h, 5);
    CHECK(dp && strcmp(dp, "/local/domain/5") == 0, "domain path");
    free(dp);
    CHECK(xs_release_domain(h, 5), "release domain 5");
    CHECK(event_is(hw, "@releaseDomain", "rel"), "@releaseDomain fires");
    CHECK(xs_unwatch(hw, "/c/w", "tok"), "unwatch");

    CHECK(xs_rm(h, XBT_NULL, "/c"), "recursive rm");
    errno = 0;
    CHECK(!xs_read(h, XBT_NULL, "/c/test/leaf", NULL) && errno == ENOENT, "rm removed the subtree");

    xs_close(h);
    xs_close(h2);
    xs_close(hw);
    printf("libxenstore: all checks passed\n");
    return 0;
}

/* benchmarks/native_floor.c: a PROTOTYPE, not part of datacache (whose FUSE transport is pure
 * Python, as issue 17 asks: no compiled build step). `python -m benchmarks.native_floor` compiles
 * it with gcc into a temporary directory and mounts it next to datacache's no-open mount, to
 * measure what a compiled request loop would give on the small-file workload: the floor any FUSE
 * server reaches on this kernel, whatever its language.
 *
 * The smallest server a no-open, read-only mount of a directory needs: INIT (NO_OPEN_SUPPORT,
 * as datacache asks), LOOKUP and GETATTR from lstat(2), READ by pread(2) from a descriptor kept
 * per inode, IOCTL answered ENOTTY (the isatty() of every buffered open), FLUSH answered ENOSYS
 * once (the kernel then stops sending it), everything else ENOSYS. No READDIR: the benchmark
 * opens paths it knows. Usage: native_floor MOUNTPOINT DIRECTORY THREADS (as root; runs until
 * unmounted). */
#define _GNU_SOURCE
#include <linux/fuse.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/ioctl.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <stdint.h>

#define MAXN 65536            /* inodes: plenty for the benchmark's trees */
#define SLOTS (2 * MAXN)       /* open-addressing table of path -> inode, never more than half full */
#define BUFSZ ((1 << 20) + 8192)
static char *paths[MAXN]; static int fds[MAXN]; static int nnodes = 2;
static uint32_t slots[SLOTS];  /* 0: empty, else an inode number */
static pthread_mutex_t lk = PTHREAD_MUTEX_INITIALIZER;
static int devfd;

static uint32_t fnv1a(const char *p) {
    uint32_t h = 2166136261u;
    while (*p) h = (h ^ (unsigned char)*p++) * 16777619u;
    return h;
}
/* The inode of path p, made on first sight; 0 when the table is full. */
static uint64_t find_or_add(const char *p) {
    pthread_mutex_lock(&lk);
    uint32_t i = fnv1a(p) % SLOTS;
    while (slots[i] && strcmp(paths[slots[i]], p)) i = (i + 1) % SLOTS;
    uint64_t ino = slots[i];
    if (!ino && nnodes < MAXN) { ino = nnodes++; paths[ino] = strdup(p); fds[ino] = -1; slots[i] = ino; }
    pthread_mutex_unlock(&lk);
    return ino;
}
static void fill_attr(struct fuse_attr *a, struct stat *st, uint64_t ino) {
    memset(a, 0, sizeof *a);
    a->ino = ino; a->size = st->st_size; a->blocks = st->st_blocks; a->mtime = st->st_mtime;
    a->ctime = st->st_ctime; a->atime = st->st_atime; a->mode = st->st_mode; a->nlink = st->st_nlink;
    a->blksize = 4096;
}
static void reply(int fd, uint64_t unique, int err, const void *p, size_t n) {
    struct fuse_out_header h = { sizeof h + n, err, unique };
    struct iovec v[2] = { { &h, sizeof h }, { (void *)p, n } };
    if (writev(fd, v, n ? 2 : 1) < 0 && errno != ENOENT) perror("writev");
}
static void *loop(void *arg) {
    int fd = devfd;
    if (arg) {  /* cloned descriptor per thread */
        fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
        uint32_t src = devfd; if (ioctl(fd, FUSE_DEV_IOC_CLONE, &src) < 0) { perror("clone"); exit(1); }
    }
    char *buf = aligned_alloc(4096, BUFSZ), *data = aligned_alloc(4096, 1 << 20);
    char path[4096];
    for (;;) {
        ssize_t n = read(fd, buf, BUFSZ);
        if (n < 0) { if (errno == EINTR || errno == EAGAIN || errno == ENOENT) continue; if (errno == ENODEV) return 0; perror("read"); return 0; }
        struct fuse_in_header *in = (void *)buf; void *body = buf + sizeof *in;
        uint64_t nid = in->nodeid;
        switch (in->opcode) {
        case FUSE_INIT: {
            struct fuse_init_in *ii = body; struct fuse_init_out o; memset(&o, 0, sizeof o);
            o.major = 7; o.minor = 38;
            o.max_readahead = ii->max_readahead < (1u << 20) ? ii->max_readahead : (1u << 20);
            o.flags = ii->flags & (FUSE_ASYNC_READ | FUSE_PARALLEL_DIROPS | FUSE_MAX_PAGES | FUSE_NO_OPEN_SUPPORT | FUSE_NO_OPENDIR_SUPPORT | FUSE_INIT_EXT);
            o.max_background = 64; o.congestion_threshold = 48; o.max_write = 1 << 17; o.time_gran = 1; o.max_pages = 256;
            reply(fd, in->unique, 0, &o, sizeof o); break; }
        case FUSE_LOOKUP: {
            const char *name = body; struct stat st;
            snprintf(path, sizeof path, "%s/%s", paths[nid], name);
            if (lstat(path, &st) < 0) { reply(fd, in->unique, -errno, 0, 0); break; }
            uint64_t ino = find_or_add(path);
            if (!ino) { reply(fd, in->unique, -ENOSPC, 0, 0); break; }
            struct fuse_entry_out e; memset(&e, 0, sizeof e);
            e.nodeid = ino; e.entry_valid = 60; e.attr_valid = 60; fill_attr(&e.attr, &st, ino);
            reply(fd, in->unique, 0, &e, sizeof e); break; }
        case FUSE_GETATTR: {
            struct stat st; if (lstat(paths[nid], &st) < 0) { reply(fd, in->unique, -errno, 0, 0); break; }
            struct fuse_attr_out a; memset(&a, 0, sizeof a); a.attr_valid = 60; fill_attr(&a.attr, &st, nid);
            reply(fd, in->unique, 0, &a, sizeof a); break; }
        case FUSE_READ: {
            struct fuse_read_in *r = body;
            int f = __atomic_load_n(&fds[nid], __ATOMIC_ACQUIRE);
            if (f < 0) { f = open(paths[nid], O_RDONLY | O_CLOEXEC); int exp = -1;
                if (!__atomic_compare_exchange_n(&fds[nid], &exp, f, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) { close(f); f = exp; } }
            ssize_t got = pread(f, data, r->size, r->offset);
            if (got < 0) reply(fd, in->unique, -errno, 0, 0); else reply(fd, in->unique, 0, data, got);
            break; }
        case FUSE_IOCTL: reply(fd, in->unique, -ENOTTY, 0, 0); break;
        case FUSE_FORGET: case FUSE_BATCH_FORGET: break;
        case FUSE_STATFS: { struct fuse_statfs_out s; memset(&s, 0, sizeof s); s.st.bsize = 4096; s.st.namelen = 255;
            reply(fd, in->unique, 0, &s, sizeof s); break; }
        case FUSE_DESTROY: reply(fd, in->unique, 0, 0, 0); return 0;
        default: reply(fd, in->unique, -ENOSYS, 0, 0);
        }
    }
}
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: native_floor MOUNTPOINT DIRECTORY THREADS\n"); return 2; }
    int threads = atoi(argv[3]);
    paths[1] = strdup(argv[2]); fds[1] = -1;
    devfd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    char opts[256]; snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other", devfd);
    if (mount("native_floor", argv[1], "fuse.native_floor", MS_RDONLY | MS_NOSUID | MS_NODEV, opts) < 0) { perror("mount"); return 1; }
    pthread_t t[64];
    for (int i = 1; i < threads && i < 64; i++) pthread_create(&t[i], 0, loop, (void *)1);
    loop(0);
    return 0;
}

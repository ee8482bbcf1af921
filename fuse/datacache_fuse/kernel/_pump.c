/* The request loops' fast path, called through ctypes (no Python API: the GIL is released for
 * the whole call).
 *
 * Both loops answer IOCTL themselves with ENOTTY, the answer to Python < 3.14's isatty() of every
 * buffered open(), and return at the first other request for the Python handlers to answer. With
 * a page-cache-hot file of a no-open mount that IOCTL is the only request a file costs, so hot
 * small-file epochs cost no Python at all.
 *
 * dc_pump reads /dev/fuse. dc_ring_pump serves one FUSE-over-io_uring queue: it reaps the ring's
 * completions (each a request in a registered entry's header buffer) and re-arms an IOCTL's entry
 * with its answer (FUSE_IO_URING_CMD_COMMIT_AND_FETCH), so a request of the CPU this thread is
 * pinned to is answered without leaving that CPU or taking the GIL.
 *
 * Both also answer the read-only OPEN of an inode that the Python handlers listed in a struct
 * dc_fast (datacache_fuse.kernel.fast_open): a file passed through before, whose backing id is
 * kept; the reply passes it through again with that id and fh FAST_FH, and counts the handle in
 * its slot until its RELEASE uncounts it (so the id stays registered while the kernel may still
 * look it up, in the opener's context, after the reply). That RELEASE is answered here too (its
 * inode logged for Python's read listeners), but for the last handle of a retired slot, which
 * Python answers (and then lets go of the id).
 *
 * Layouts: struct fuse_in_header, fuse_out_header and fuse_uring_ent_in_out / fuse_uring_cmd_req
 * of the kernel's include/uapi/linux/fuse.h (FUSE_IOCTL = 39 since 7.11; io_uring since 7.42);
 * struct io_uring_sqe (128-byte with IORING_SETUP_SQE128) and io_uring_cqe of
 * include/uapi/linux/io_uring.h; the ring's head/tail protocol of io_uring_enter(2).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

struct in_header {
    uint32_t len, opcode;
    uint64_t unique, nodeid;
    uint32_t uid, gid, pid;
    uint16_t total_extlen, padding;
};

struct out_header {
    uint32_t len;
    int32_t error;
    uint64_t unique;
};

#define OP_OPEN 14
#define OP_RELEASE 18
#define OP_IOCTL 39
#define IN_HEADER_SIZE 40 /* sizeof(struct fuse_in_header): a /dev/fuse request's op header follows */
#define OP_IN 128 /* struct fuse_uring_req_header: in_out[128], then op_in[128] */

/* struct fuse_open_in / fuse_open_out; FOPEN_PASSTHROUGH = 1 << 7 (7.40) */
struct open_in {
    uint32_t flags, open_flags;
};
struct open_out {
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
};
/* struct fuse_release_in */
struct release_in {
    uint64_t fh;
    uint32_t flags, release_flags;
    uint64_t lock_owner;
};
#define FOPEN_PASSTHROUGH (1u << 7)
#define FAST_FH (1ull << 63)
/* open(2) flags that take write access or change the file: those OPENs go to Python (EROFS) */
#define WRITE_ACCESS (O_WRONLY | O_RDWR | O_TRUNC | O_APPEND | O_CREAT)

struct dc_fast_slot {
    uint64_t nodeid; /* 0: free */
    int32_t backing_id;
    uint32_t handles; /* handles opened here and not yet released */
    uint32_t retired; /* no more opens here; freed by the release of its last handle */
    uint32_t pad;
};

#define FAST_LOG 256

/* The inodes whose OPEN is answered here: `size` slots, scanned in full (a few dozen); `lock` a
 * spin lock held for a few instructions, by C here and by dc_fast_* calls from Python. The
 * RELEASEs answered here log their inode (`logged` so far, the last FAST_LOG kept) for Python to
 * tell its read listeners (dc_fast_drain); one logged into an empty log adds 1 to the eventfd
 * `wake` (-1: none), which Python's drain thread waits on, so an idle mount wakes no thread. */
struct dc_fast {
    uint32_t lock, size;
    uint64_t opens; /* OPENs answered here */
    struct dc_fast_slot *slots;
    uint64_t logged, drained;
    uint64_t log[FAST_LOG];
    int32_t wake;
    uint32_t pad;
};

static void fast_lock(struct dc_fast *f)
{
    while (__atomic_exchange_n(&f->lock, 1, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&f->lock, __ATOMIC_RELAXED))
            ;
}

static void fast_unlock(struct dc_fast *f) { __atomic_store_n(&f->lock, 0, __ATOMIC_RELEASE); }

static struct dc_fast_slot *fast_find(struct dc_fast *f, uint64_t nodeid)
{
    for (uint32_t i = 0; i < f->size; i++)
        if (f->slots[i].nodeid == nodeid)
            return &f->slots[i];
    return NULL;
}

/* Fills *out and counts the handle when this OPEN is answered here; returns 0 when Python answers. */
static int fast_open(struct dc_fast *f, uint64_t nodeid, const struct open_in *in, struct open_out *out)
{
    if (f == NULL || nodeid == 0 || (in->flags & WRITE_ACCESS))
        return 0;
    int32_t backing_id = 0;
    fast_lock(f);
    struct dc_fast_slot *s = fast_find(f, nodeid);
    if (s != NULL && !s->retired) {
        s->handles += 1;
        backing_id = s->backing_id;
    }
    fast_unlock(f);
    if (!backing_id)
        return 0;
    __atomic_add_fetch(&f->opens, 1, __ATOMIC_RELAXED);
    out->fh = FAST_FH;
    out->open_flags = FOPEN_PASSTHROUGH;
    out->backing_id = backing_id;
    return 1;
}

/* Answers (uncounts and logs) the RELEASE of a handle opened here; returns 0 when Python answers:
 * not such a handle, or the last one of a retired slot (Python then lets go of its backing id). */
static int fast_release(struct dc_fast *f, uint64_t nodeid, const struct release_in *in)
{
    if (f == NULL || in->fh != FAST_FH)
        return 0;
    int done = 0, wake = -1;
    fast_lock(f);
    struct dc_fast_slot *s = fast_find(f, nodeid);
    if (s != NULL && s->handles > (s->retired ? 1u : 0u)) {
        s->handles -= 1;
        if (f->logged == f->drained)
            wake = f->wake;
        f->log[f->logged % FAST_LOG] = nodeid;
        f->logged += 1;
        done = 1;
    }
    fast_unlock(f);
    if (wake >= 0) {
        uint64_t one = 1;
        (void)!write(wake, &one, sizeof one); /* fails only when the counter is full: a wake-up is due then */
    }
    return done;
}

/* Copies into out (room for max) the inodes of the RELEASEs answered here since the last call,
 * oldest first; returns how many; *lost: how many were overwritten before this call. */
int dc_fast_drain(struct dc_fast *f, uint64_t *out, int max, uint64_t *lost)
{
    int n = 0;
    fast_lock(f);
    *lost = 0;
    if (f->logged - f->drained > FAST_LOG) {
        *lost = f->logged - f->drained - FAST_LOG;
        f->drained = f->logged - FAST_LOG;
    }
    while (f->drained < f->logged && n < max)
        out[n++] = f->log[f->drained++ % FAST_LOG];
    fast_unlock(f);
    return n;
}

/* List `nodeid` with `backing_id`: 1, or 0 when it is listed already or every slot is taken. */
int dc_fast_put(struct dc_fast *f, uint64_t nodeid, int32_t backing_id)
{
    int done = 0;
    fast_lock(f);
    struct dc_fast_slot *s = fast_find(f, nodeid);
    if (s == NULL && (s = fast_find(f, 0)) != NULL) {
        *s = (struct dc_fast_slot){nodeid, backing_id, 0, 0, 0};
        done = 1;
    }
    fast_unlock(f);
    return done;
}

/* Under the lock: `drop` handles fewer (-1 when the slot has not that many, or none), retired if
 * `retire`; a retired slot with no handle left is freed: 1 then, else 0. */
static int fast_settle(struct dc_fast *f, uint64_t nodeid, uint32_t retire, uint32_t drop)
{
    int done = -1;
    fast_lock(f);
    struct dc_fast_slot *s = fast_find(f, nodeid);
    if (s != NULL && s->handles >= drop) {
        s->handles -= drop;
        s->retired |= retire;
        done = s->retired && s->handles == 0;
        if (done)
            s->nodeid = 0;
    }
    fast_unlock(f);
    return done;
}

/* Stop answering `nodeid`'s OPENs: 1 when its slot is free now (no handle of it open), 0 when the
 * release of its last handle frees it (dc_fast_release then returns 1), -1 when it is not listed.
 * Called again for a retired slot, the same. */
int dc_fast_retire(struct dc_fast *f, uint64_t nodeid) { return fast_settle(f, nodeid, 1, 0); }

/* A handle opened here was released: 1 when that freed its retired slot, 0 otherwise, -1 when
 * `nodeid` has no counted handle (a caller's bug). */
int dc_fast_release(struct dc_fast *f, uint64_t nodeid) { return fast_settle(f, nodeid, 0, 1); }

/* Returns the length (bytes) of the next request that is not an IOCTL, or -errno of the read
 * (ENOENT: that request was interrupted; ENODEV: the connection ended). *ioctls counts the
 * IOCTLs answered here, each before its reply is written (a caller that sees the answer sees the
 * count). A failed ENOTTY reply is not reported (the Python loop logs other errnos than these
 * two): ENOENT (interrupted) needs nothing, ENODEV (unmounted) comes back from the next read. */
long dc_pump(int fd, void *buf, size_t size, uint64_t *ioctls, struct dc_fast *fast)
{
    for (;;) {
        ssize_t n = read(fd, buf, size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        const struct in_header *in = buf;
        if ((size_t)n < sizeof *in)
            return n;
        if (in->opcode == OP_OPEN && (size_t)n >= IN_HEADER_SIZE + sizeof(struct open_in)) {
            struct {
                struct out_header h;
                struct open_out o;
            } reply = {{sizeof reply, 0, in->unique}, {0, 0, 0}};
            if (!fast_open(fast, in->nodeid, (const struct open_in *)((const uint8_t *)buf + IN_HEADER_SIZE),
                           &reply.o))
                return n;
            (void)!write(fd, &reply, sizeof reply); /* ENOENT: interrupted; its RELEASE still comes */
            continue;
        }
        if (in->opcode == OP_RELEASE && (size_t)n >= IN_HEADER_SIZE + sizeof(struct release_in)
            && fast_release(fast, in->nodeid, (const struct release_in *)((const uint8_t *)buf + IN_HEADER_SIZE))) {
            struct out_header out = {sizeof out, 0, in->unique};
            (void)!write(fd, &out, sizeof out);
            continue;
        }
        if (in->opcode != OP_IOCTL)
            return n;
        struct out_header out = {sizeof out, -ENOTTY, in->unique};
        __atomic_add_fetch(ioctls, 1, __ATOMIC_RELAXED);
        (void)!write(fd, &out, sizeof out);
    }
}

/* One io_uring's shared state, filled by datacache_fuse.kernel.uring.Ring (a ctypes Structure
 * of the same layout): the mapped ring's fields and Ring's own bookkeeping (tail: the next SQ
 * tail; pending: SQEs queued and not yet submitted), which both sides update, from one thread. */
struct dc_ring {
    uint32_t *sq_head, *sq_tail, *sq_array, *cq_head, *cq_tail;
    uint8_t *sqes, *cqes;
    uint32_t sq_mask, sq_entries, cq_mask;
    int32_t fd;
    uint32_t tail, pending;
};

/* One FUSE ring queue: its /dev/fuse descriptor, queue id and registered entries (entry i's
 * header buffer and its two iovecs, the user_data of its commands being i). */
struct dc_queue {
    int32_t fuse_fd;
    uint32_t qid, entries;
    uint8_t **headers;
    void **iovs;
};

#define NR_IO_URING_ENTER 426
#define ENTER_GETEVENTS 1u
#define SQE_SIZE 128
#define OP_URING_CMD 46
#define CMD_COMMIT_AND_FETCH 2
#define ENT_IN_OUT 256 /* struct fuse_uring_ent_in_out in the header buffer: flags, commit_id, payload_sz */

/* Queue a COMMIT_AND_FETCH of entry `index` (its answer already in its header buffer); -EBUSY
 * when the SQ is full (it holds twice the entries, so only a caller's bug fills it). */
static int queue_commit(struct dc_ring *r, const struct dc_queue *q, uint32_t index, uint64_t commit_id)
{
    uint32_t head = __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
    if (r->tail - head >= r->sq_entries)
        return -EBUSY;
    uint32_t slot = r->tail & r->sq_mask;
    uint8_t *sqe = r->sqes + (size_t)slot * SQE_SIZE;
    memset(sqe, 0, SQE_SIZE);
    uint32_t cmd_op = CMD_COMMIT_AND_FETCH, len = 2;
    uint64_t addr = (uint64_t)(uintptr_t)q->iovs[index], user_data = index;
    uint16_t qid = (uint16_t)q->qid;
    sqe[0] = OP_URING_CMD;
    memcpy(sqe + 4, &q->fuse_fd, 4);
    memcpy(sqe + 8, &cmd_op, 4);
    memcpy(sqe + 16, &addr, 8);
    memcpy(sqe + 24, &len, 4);
    memcpy(sqe + 32, &user_data, 8);
    memcpy(sqe + 48 + 8, &commit_id, 8); /* fuse_uring_cmd_req: flags, commit_id, qid */
    memcpy(sqe + 48 + 16, &qid, 2);
    r->sq_array[slot] = slot;
    r->tail += 1;
    __atomic_store_n(r->sq_tail, r->tail, __ATOMIC_RELEASE);
    r->pending += 1;
    return 0;
}

/* Returns the entry index of the next completion that is not an IOCTL request (its result, a
 * request's 0 or -errno, in *res), after submitting what is queued and waiting as needed; or
 * -errno of io_uring_enter (EINTR is retried) or -EBUSY (SQ full). *ioctls counts the IOCTLs
 * answered here. */
long dc_ring_pump(struct dc_ring *r, const struct dc_queue *q, uint64_t *ioctls, int32_t *res,
                  struct dc_fast *fast)
{
    for (;;) {
        uint32_t head = *r->cq_head;
        uint32_t tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        while (head != tail) {
            const uint8_t *cqe = r->cqes + (size_t)(head & r->cq_mask) * 16;
            uint64_t user_data;
            int32_t cres;
            memcpy(&user_data, cqe, 8);
            memcpy(&cres, cqe + 8, 4);
            __atomic_store_n(r->cq_head, ++head, __ATOMIC_RELEASE);
            if (cres >= 0 && user_data < q->entries) {
                uint8_t *hdr = q->headers[user_data];
                const struct in_header *in = (const struct in_header *)hdr;
                struct open_out opened;
                int fast_opened = in->opcode == OP_OPEN
                                  && fast_open(fast, in->nodeid, (const struct open_in *)(hdr + OP_IN), &opened);
                int fast_released = in->opcode == OP_RELEASE
                                    && fast_release(fast, in->nodeid, (const struct release_in *)(hdr + OP_IN));
                int ioctl = in->opcode == OP_IOCTL;
                if (ioctl || fast_opened || fast_released) { /* answered here (the answer overwrites *in) */
                    uint64_t commit_id;
                    uint32_t payload_sz = fast_opened ? sizeof opened : 0;
                    struct out_header out = {sizeof out + payload_sz, ioctl ? -ENOTTY : 0, in->unique};
                    memcpy(&commit_id, hdr + ENT_IN_OUT + 8, 8);
                    memcpy(hdr, &out, sizeof out);
                    memcpy(hdr + ENT_IN_OUT + 16, &payload_sz, 4);
                    if (fast_opened) /* the payload buffer: the entry's second iovec */
                        memcpy(((struct iovec *)q->iovs[user_data])[1].iov_base, &opened, sizeof opened);
                    else if (ioctl)
                        __atomic_add_fetch(ioctls, 1, __ATOMIC_RELAXED);
                    int err = queue_commit(r, q, (uint32_t)user_data, commit_id);
                    if (err)
                        return err;
                    continue;
                }
            }
            if (r->pending) { /* the IOCTL answers queued so far go out now, not after Python's request */
                long sent = syscall(NR_IO_URING_ENTER, r->fd, r->pending, 0, 0, NULL, 0);
                if (sent > 0)
                    r->pending -= (uint32_t)sent < r->pending ? (uint32_t)sent : r->pending;
            }
            *res = cres;
            return (long)user_data;
        }
        long done = syscall(NR_IO_URING_ENTER, r->fd, r->pending, 1, ENTER_GETEVENTS, NULL, 0);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        r->pending -= (uint32_t)done < r->pending ? (uint32_t)done : r->pending;
    }
}

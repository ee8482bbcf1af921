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
 * Layouts: struct fuse_in_header, fuse_out_header and fuse_uring_ent_in_out / fuse_uring_cmd_req
 * of the kernel's include/uapi/linux/fuse.h (FUSE_IOCTL = 39 since 7.11; io_uring since 7.42);
 * struct io_uring_sqe (128-byte with IORING_SETUP_SQE128) and io_uring_cqe of
 * include/uapi/linux/io_uring.h; the ring's head/tail protocol of io_uring_enter(2).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
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

#define OP_IOCTL 39

/* Returns the length (bytes) of the next request that is not an IOCTL, or -errno of the read
 * (ENOENT: that request was interrupted; ENODEV: the connection ended). *ioctls counts the
 * IOCTLs answered here, each before its reply is written (a caller that sees the answer sees the
 * count). A failed ENOTTY reply is not reported (the Python loop logs other errnos than these
 * two): ENOENT (interrupted) needs nothing, ENODEV (unmounted) comes back from the next read. */
long dc_pump(int fd, void *buf, size_t size, uint64_t *ioctls)
{
    for (;;) {
        ssize_t n = read(fd, buf, size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        const struct in_header *in = buf;
        if ((size_t)n < sizeof *in || in->opcode != OP_IOCTL)
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
long dc_ring_pump(struct dc_ring *r, const struct dc_queue *q, uint64_t *ioctls, int32_t *res)
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
                if (in->opcode == OP_IOCTL) {
                    uint64_t commit_id;
                    uint32_t payload_sz = 0;
                    struct out_header out = {sizeof out, -ENOTTY, in->unique};
                    memcpy(&commit_id, hdr + ENT_IN_OUT + 8, 8);
                    memcpy(hdr, &out, sizeof out);
                    memcpy(hdr + ENT_IN_OUT + 16, &payload_sz, 4);
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

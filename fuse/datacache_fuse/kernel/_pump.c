/* The request loop's fast path, called through ctypes (no Python API: the GIL is released for
 * the whole call).
 *
 * dc_pump reads requests from a /dev/fuse descriptor into the caller's buffer and answers IOCTL
 * itself with ENOTTY, the answer to Python < 3.14's isatty() of every buffered open(); it returns
 * at the first other request, whose length it returns, for the Python handlers to answer. With a
 * page-cache-hot file of a no-open mount that IOCTL is the only request a file costs, so hot
 * small-file epochs cost no Python at all. Layouts: struct fuse_in_header and fuse_out_header of
 * the kernel's include/uapi/linux/fuse.h (unchanged since 7.0; FUSE_IOCTL = 39 since 7.11).
 */
#include <errno.h>
#include <stdint.h>
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
 * IOCTLs answered here. A failed ENOTTY reply is not reported (the Python loop logs other
 * errnos than these two): ENOENT (interrupted) needs nothing, ENODEV (unmounted) comes back from
 * the next read. */
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
        (void)!write(fd, &out, sizeof out);
        ++*ioctls;
    }
}

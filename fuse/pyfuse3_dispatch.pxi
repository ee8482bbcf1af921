# datacache's addition to pyfuse3 (included into pyfuse3/__init__.pyx by fuse/build_pyfuse3.py).
#
# pyfuse3's main() waits for each request in a task: an asyncio lock, a future and an
# add_reader/remove_reader pair (two epoll_ctl calls) per request, ~19 us of daemon CPU. Python's
# buffered open() sends one FUSE_IOCTL per file (isatty), which libfuse answers in C, so on a warm
# epoch of small files that wait is the daemon's whole cost. main_readable() reads requests from one
# reader callback instead (~2 us per request measured with reader and daemon on one CPU).

cdef fuse_buf _dispatch_buf
cdef object _dispatch_active = None


class _Dispatcher:
    '''Receives and processes queued requests from an asyncio reader callback on the non-blocking
    FUSE fd. A request whose handler is a coroutine runs as a task; with *max_tasks* tasks running
    the fd is not read until one ends (the kernel queues the rest). The first exception other than
    FUSEError that a task raises ends the loop, as it ends pyfuse3's main().'''

    def __init__(self, loop, int max_tasks):
        self.loop = loop
        self.max_tasks = max_tasks
        self.tasks = set()
        self.done = loop.create_future()
        self.reading = False

    def start(self):
        if not self.reading and not self.done.done():
            self.loop.add_reader(session_fd, self.readable)
            self.reading = True

    def stop(self):
        if self.reading:
            self.loop.remove_reader(session_fd)
            self.reading = False

    def finish(self, exc=None):
        if not self.done.done():
            if exc is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(exc)

    def readable(self):
        cdef int res
        cdef int n = 0
        while n < 256:  # then the loop runs its other callbacks; the fd is still readable
            if fuse_session_exited(session):
                self.finish()
                return
            if len(self.tasks) >= self.max_tasks:
                self.stop()
                return
            res = fuse_session_receive_buf(session, &_dispatch_buf)
            if res == -errno.EAGAIN:
                return
            if res == -errno.EINTR:
                continue
            if res == 0:  # unmounted
                self.finish()
                return
            if res < 0:
                self.finish(OSError(-res, 'fuse_session_receive_buf failed with ' + strerror(-res)))
                return
            n += 1
            save_retval(None)
            fuse_session_process_buf(session, &_dispatch_buf)
            if py_retval is not None:
                task = self.loop.create_task(py_retval)
                self.tasks.add(task)
                task.add_done_callback(self.task_done)

    def task_done(self, task):
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.finish(task.exception())
        elif not self.reading and len(self.tasks) < self.max_tasks:
            self.start()


async def main_readable(int max_tasks=99):
    '''Run the FUSE main loop on the running asyncio loop (see _Dispatcher); needs
    ``pyfuse3.asyncio.enable()`` and ``init()`` first.

    Returns when the session ends (unmount, or ``terminate()``); raises what a request handler
    raised other than FUSEError, as ``main()`` does. Tasks still running then are cancelled.'''

    global trio_token, _dispatch_active
    if session == NULL:
        raise RuntimeError('Need to call init() before main_readable()')
    import asyncio
    loop = asyncio.get_running_loop()
    trio_token = trio.lowlevel.current_trio_token()
    os.set_blocking(session_fd, False)
    dispatcher = _Dispatcher(loop, max_tasks)
    _dispatch_active = dispatcher
    dispatcher.start()
    try:
        await dispatcher.done
    finally:
        _dispatch_active = None
        dispatcher.stop()
        for task in list(dispatcher.tasks):
            task.cancel()
        if dispatcher.tasks:
            await asyncio.gather(*dispatcher.tasks, return_exceptions=True)
        stdlib.free(_dispatch_buf.mem)
        _dispatch_buf.mem = NULL
        _dispatch_buf.size = 0
        trio_token = None
        if _notify_queue is not None:
            _notify_queue.put(None)

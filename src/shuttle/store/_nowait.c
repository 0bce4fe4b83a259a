/* A read of what the page cache holds, straight into a new bytes object.
 *
 * shuttle/store/nowait.py's pure reference (ReusedBufferPread) reads with
 * os.preadv(..., RWF_NOWAIT) into a bytearray and copies it into bytes, because Python
 * can only read into a writable buffer: for a 64 KiB block that copy was a sixth of a
 * node's block-cache miss (benchmarks/README.md, "The miss path"). Here preadv2 reads
 * into the bytes object it returns, which nobody else can see yet, so there is no
 * second copy. Built with the compiled modules (scripts/build_compiled.py) and used
 * when they are (shuttle/compiled.py); tests/unit/store/test_nowait_reads.py checks it
 * against the reference on the same files.
 *
 * pread_nowait(fd, length, offset) -> bytes: what the page cache holds of
 * [offset, offset + length), shorter when only the start of the range is resident (or
 * at the end of the file); raises BlockingIOError (EAGAIN) when none of it is, and
 * OSError for anything else, as os.preadv does. The GIL is kept: the read never waits
 * for the device, and an event loop that let go of the GIL for a few microseconds
 * could wait for a pool thread's whole switch interval to get it back.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <sys/uio.h>

#if defined(__linux__) && !defined(RWF_NOWAIT)
#define RWF_NOWAIT 0x00000008 /* linux/fs.h, Linux 4.14 */
#endif

static PyObject *pread_nowait(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "pread_nowait(fd, length, offset) takes 3 arguments, got %zd",
                     nargs);
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t length = PyLong_AsSsize_t(args[1]);
    if (length == -1 && PyErr_Occurred()) return NULL;
    long long offset = PyLong_AsLongLong(args[2]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (fd < 0 || fd > INT_MAX || length < 0 || offset < 0) {
        PyErr_Format(PyExc_ValueError,
                     "pread_nowait: fd, length and offset must be >= 0 (fd an int), got %ld, "
                     "%zd, %lld",
                     fd, length, offset);
        return NULL;
    }
#if defined(__linux__)
    PyObject *out = PyBytes_FromStringAndSize(NULL, length);
    if (out == NULL) return NULL;
    struct iovec iov = {PyBytes_AS_STRING(out), (size_t)length};
    ssize_t got;
    for (;;) {
        got = preadv2((int)fd, &iov, 1, (off_t)offset, RWF_NOWAIT);
        if (got >= 0 || errno != EINTR) break;
        if (PyErr_CheckSignals() < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (got < 0) {
        Py_DECREF(out);
        return PyErr_SetFromErrno(PyExc_OSError); /* EAGAIN: BlockingIOError */
    }
    if (got < length && _PyBytes_Resize(&out, got) < 0) return NULL;
    return out;
#else
    errno = ENOSYS;
    return PyErr_SetFromErrno(PyExc_OSError);
#endif
}

static PyMethodDef methods[] = {
    {"pread_nowait", (PyCFunction)(void (*)(void))pread_nowait, METH_FASTCALL,
     "pread_nowait(fd, length, offset) -> bytes: what the page cache holds of the range, "
     "read with preadv2(RWF_NOWAIT) into the bytes returned."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "shuttle.store._nowait",
    "A read of what the page cache holds into a new bytes object (reference: "
    "shuttle/store/nowait.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__nowait(void) { return PyModule_Create(&module); }

/* librados asynchronous reads whose completion never takes the GIL.
 *
 * shuttle/store/rados_aio.py's reference path (ctypes) gives librados a Python callback:
 * on librados's callback thread, ctypes takes the GIL, builds the arguments, runs
 * Python that asks the completion for its result and version, and wakes the event loop
 * with call_soon_threadsafe (benchmarks/README.md, "Warm reads on a RADOS gateway",
 * measured that hand-off). Here the callback is C: it asks the completion for its
 * result and version, releases it, appends the read to a FIFO list under a mutex and,
 * if the list was empty, writes 1 to an eventfd; that is all it does, and it touches no
 * Python object. The loop watches the eventfd (add_reader) and drain() hands it every
 * finished read at once, in the order librados finished them.
 *
 * librados is not linked: the caller passes the addresses of the five librados
 * functions used (from the ctypes library rados_aio.py loads), so the module builds
 * without Ceph's headers and imports without librados; the prototypes below are
 * librados.h's (Ceph 15 and newer).
 *
 * Completions(create_completion2, aio_read, get_return_value, get_version, release):
 *   .fileno() -> the eventfd the loop watches;
 *   .read(ioctx, oid, offset, length, arg) -> 0 (started: arg comes back from drain())
 *     or minus an errno (not started: ESHUTDOWN once closed, else librados's refusal);
 *   .drain() -> [(arg, rv, version, data, done_ns), ...]: the finished reads, oldest
 *     first; rv the bytes read or minus librados's errno, data the bytes (b"" on an
 *     error), done_ns the CLOCK_MONOTONIC time (time.monotonic_ns) of the callback;
 *     MemoryError (nothing taken: the reads wait for the next drain) if it could
 *     build no answer;
 *   .in_flight() -> reads started and not yet drained;
 *   .wait_idle(timeout_s) -> True once librados has called back for every read it was
 *     given (False at the timeout; math.inf, or anything over WAIT_S_MAX, waits with no
 *     deadline; ValueError if negative or NaN); the GIL is let go meanwhile;
 *   .close(timeout_s) -> starts no more reads, then wait_idle(timeout_s).
 *
 * Lifetimes. A read's buffer is a new bytes object nobody else can see until drain()
 * returns it (librados writes into it on its own thread, which is why nothing else may
 * hold it). The shared state (the mutex, the list, the eventfd) lives apart from the
 * Python object: if the object goes away while librados still holds a read (close()
 * timed out), that state and the read's buffer are kept for good rather than freed
 * under librados. The callback does everything it does to that state under its mutex,
 * the eventfd write included, so once wait_idle() has seen no read left in librados no
 * callback touches it again.
 *
 * Read again for defects (docs/security.md, "The C extensions under hostile input"):
 * the callback calls no Python API and takes only the mutex; a slot's two references
 * are owned until drain() hands them on (the buffer, stolen into the answer, resized
 * only while nothing else holds it) or free_slot() drops them, with the GIL; the
 * completion is released before the read counts as called back, so close() never
 * shuts librados down under a release; the eventfd is written, under the mutex, each
 * time the list goes from empty to not, and drain() reads it before taking the list,
 * so no finished read waits without a wake-up. Under memory exhaustion no read is
 * lost: a read leaves the list only once its answer is in the list drain() returns;
 * those whose answer cannot be built go back to the head of the list, oldest first,
 * and the eventfd is written again, so the loop's next turn drains them (drain()
 * returns the answers it built, or raises MemoryError if it built none). A short read
 * whose buffer cannot be shrunk (CPython then frees it) is answered with -ENOMEM.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* librados.h (Ceph 15+), declared here so the module needs no Ceph headers. */
typedef void *rados_completion_t;
typedef void *rados_ioctx_t;
typedef void (*rados_callback_t)(rados_completion_t cb, void *arg);
typedef int (*create_completion2_fn)(void *cb_arg, rados_callback_t cb_complete,
                                     rados_completion_t *pc);
typedef int (*aio_read_fn)(rados_ioctx_t io, const char *oid, rados_completion_t completion,
                           char *buf, size_t len, uint64_t off);
typedef int (*get_return_value_fn)(rados_completion_t c);
typedef uint64_t (*get_version_fn)(rados_completion_t c);
typedef void (*release_fn)(rados_completion_t c);

typedef struct core core;

typedef struct slot {
    struct slot *next;
    core *k;
    PyObject *buf; /* the bytes object librados writes into (owned) */
    PyObject *arg; /* the caller's object, handed back by drain() (owned) */
    int rv;
    uint64_t version;
    int64_t done_ns;
} slot;

struct core {
    pthread_mutex_t mu;
    pthread_cond_t idle;
    slot *head, *tail;  /* finished reads, oldest first */
    long ready;         /* how many: drain() sizes its list with it */
    long in_librados;   /* started, not called back yet */
    long undrained;     /* started, not drained yet */
    int closed;
    int efd;
    create_completion2_fn create_completion2;
    aio_read_fn aio_read;
    get_return_value_fn get_return_value;
    get_version_fn get_version;
    release_fn release;
};

typedef struct {
    PyObject_HEAD core *k;
} Completions;

/* Made at import: what drain() answers a read with when it must not need memory. */
static PyObject *enomem_rv;   /* -ENOMEM (outside CPython's cached small ints) */
static PyObject *empty_bytes; /* b"" */

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* librados's callback thread (Ceph 16: an io_context_pool thread): no GIL, no Python. */
static void on_complete(rados_completion_t c, void *arg) {
    slot *s = (slot *)arg;
    core *k = s->k;
    s->rv = k->get_return_value(c);
    s->version = k->get_version(c);
    k->release(c);
    s->next = NULL;
    pthread_mutex_lock(&k->mu);
    /* Stamped under the lock: with more than one callback thread, the list's order
     * is then the order of the stamps. */
    s->done_ns = monotonic_ns();
    int was_empty = k->head == NULL;
    if (k->tail != NULL)
        k->tail->next = s;
    else
        k->head = s;
    k->tail = s;
    k->ready++;
    if (was_empty) {
        /* One wake-up per batch: drain() reads the eventfd before it takes the list,
         * so a read appended after that read finds the list empty again and writes. */
        uint64_t one = 1;
        ssize_t w;
        do {
            w = write(k->efd, &one, sizeof one);
        } while (w < 0 && errno == EINTR);
        /* EAGAIN would mean the counter is near 2^64: the loop is already woken. */
    }
    if (--k->in_librados == 0) pthread_cond_broadcast(&k->idle);
    pthread_mutex_unlock(&k->mu);
}

static void *fn_address(PyObject *o, const char *name) {
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "Completions: the address of %s is 0", name);
    return p;
}

static PyObject *Completions_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *names[] = {"create_completion2", "aio_read", "get_return_value",
                            "get_version", "release", NULL};
    PyObject *a[5];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:Completions", names, &a[0], &a[1],
                                     &a[2], &a[3], &a[4]))
        return NULL;
    void *p[5];
    for (int i = 0; i < 5; i++) {
        p[i] = fn_address(a[i], names[i]);
        if (p[i] == NULL) return NULL;
    }
    core *k = PyMem_RawCalloc(1, sizeof *k);
    if (k == NULL) return PyErr_NoMemory();
    k->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (k->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        PyMem_RawFree(k);
        return NULL;
    }
    pthread_mutex_init(&k->mu, NULL);
    /* wait_idle()'s deadline is on the monotonic clock: a step of the wall clock (NTP,
     * an operator) must not lengthen or cut short a close. */
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&k->idle, &attr);
    pthread_condattr_destroy(&attr);
    k->create_completion2 = (create_completion2_fn)p[0];
    k->aio_read = (aio_read_fn)p[1];
    k->get_return_value = (get_return_value_fn)p[2];
    k->get_version = (get_version_fn)p[3];
    k->release = (release_fn)p[4];
    Completions *self = (Completions *)type->tp_alloc(type, 0);
    if (self == NULL) {
        close(k->efd);
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->idle);
        PyMem_RawFree(k);
        return NULL;
    }
    self->k = k;
    return (PyObject *)self;
}

static void free_slot(slot *s) {
    Py_XDECREF(s->buf);
    Py_XDECREF(s->arg);
    PyMem_RawFree(s);
}

static void Completions_dealloc(Completions *self) {
    core *k = self->k;
    if (k != NULL) {
        pthread_mutex_lock(&k->mu);
        long busy = k->in_librados;
        k->closed = 1;
        pthread_mutex_unlock(&k->mu);
        if (busy == 0) { /* no callback can come: free everything */
            slot *s = k->head;
            while (s != NULL) {
                slot *next = s->next;
                free_slot(s);
                s = next;
            }
            close(k->efd);
            pthread_mutex_destroy(&k->mu);
            pthread_cond_destroy(&k->idle);
            PyMem_RawFree(k);
        } /* else librados may still write a buffer and call back: keep it all */
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Completions_fileno(Completions *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(self->k->efd);
}

static PyObject *Completions_read(Completions *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "read(ioctx, oid, offset, length, arg) takes 5 arguments, got %zd", nargs);
        return NULL;
    }
    core *k = self->k;
    void *io = PyLong_AsVoidPtr(args[0]);
    if (io == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "read: the I/O context is a null pointer");
        return NULL;
    }
    if (!PyBytes_Check(args[1])) {
        PyErr_Format(PyExc_TypeError, "read: oid must be bytes, got %.100s",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    const char *oid = PyBytes_AS_STRING(args[1]);
    if ((size_t)PyBytes_GET_SIZE(args[1]) != strlen(oid)) {
        PyErr_SetString(PyExc_ValueError, "read: oid must not contain a NUL byte");
        return NULL;
    }
    unsigned long long offset = PyLong_AsUnsignedLongLong(args[2]);
    if (offset == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    Py_ssize_t length = PyLong_AsSsize_t(args[3]);
    if (length == -1 && PyErr_Occurred()) return NULL;
    if (length <= 0) {
        PyErr_Format(PyExc_ValueError, "read: length must be > 0, got %zd", length);
        return NULL;
    }
    slot *s = PyMem_RawCalloc(1, sizeof *s);
    if (s == NULL) return PyErr_NoMemory();
    s->k = k;
    s->buf = PyBytes_FromStringAndSize(NULL, length);
    if (s->buf == NULL) {
        PyMem_RawFree(s);
        return NULL;
    }
    Py_INCREF(args[4]);
    s->arg = args[4];
    pthread_mutex_lock(&k->mu);
    int closed = k->closed;
    if (!closed) {
        k->in_librados++;
        k->undrained++;
    }
    pthread_mutex_unlock(&k->mu);
    if (closed) {
        free_slot(s);
        return PyLong_FromLong(-ESHUTDOWN);
    }
    rados_completion_t comp = NULL;
    int rc = k->create_completion2(s, on_complete, &comp);
    if (rc == 0) {
        /* Only queues the read (librados copies the oid); the GIL is kept, as the
         * callback never needs it. */
        rc = k->aio_read(io, oid, comp, PyBytes_AS_STRING(s->buf), (size_t)length,
                         (uint64_t)offset);
        if (rc < 0) k->release(comp);
    }
    if (rc < 0) {
        pthread_mutex_lock(&k->mu);
        k->undrained--;
        if (--k->in_librados == 0) pthread_cond_broadcast(&k->idle);
        pthread_mutex_unlock(&k->mu);
        free_slot(s);
    }
    return PyLong_FromLong(rc < 0 ? rc : 0);
}

/* One finished read's answer, (arg, rv, version, data, done_ns), or NULL (a
 * MemoryError) with the slot as it was: nothing of it is taken before everything the
 * answer needs is in hand. The one exception is a short read's buffer (the object
 * ended first): shrinking it in place can fail, and CPython then frees it, so that read
 * is answered with -ENOMEM and no bytes (a clear error for its caller, not a lost
 * read). */
static PyObject *answer_of(slot *s) {
    PyObject *t = PyTuple_New(5);
    if (t == NULL) return NULL;
    PyObject *rv = PyLong_FromLong(s->rv);
    PyObject *version = PyLong_FromUnsignedLongLong((unsigned long long)s->version);
    PyObject *done_ns = PyLong_FromLongLong((long long)s->done_ns);
    if (rv == NULL || version == NULL || done_ns == NULL) {
        Py_XDECREF(rv);
        Py_XDECREF(version);
        Py_XDECREF(done_ns);
        Py_DECREF(t);
        return NULL;
    }
    PyObject *data;
    if (s->rv > 0) {
        data = s->buf; /* stolen: nobody else holds it */
        s->buf = NULL;
        if (s->rv < PyBytes_GET_SIZE(data) && _PyBytes_Resize(&data, s->rv) < 0) {
            PyErr_Clear();
            Py_DECREF(rv);
            rv = Py_NewRef(enomem_rv);
            data = Py_NewRef(empty_bytes);
        }
    } else {
        data = Py_NewRef(empty_bytes);
    }
    PyTuple_SET_ITEM(t, 0, Py_NewRef(s->arg));
    PyTuple_SET_ITEM(t, 1, rv);
    PyTuple_SET_ITEM(t, 2, version);
    PyTuple_SET_ITEM(t, 3, data);
    PyTuple_SET_ITEM(t, 4, done_ns);
    return t;
}

/* Puts reads drain() could not hand on back at the head of the list, oldest first,
 * before any that finished meanwhile, and wakes the loop again so that it comes back
 * for them (as the callback does, under the mutex). */
static void put_back(core *k, slot *first, long n) {
    slot *last = first;
    while (last->next != NULL)
        last = last->next;
    pthread_mutex_lock(&k->mu);
    last->next = k->head;
    if (k->head == NULL) k->tail = last;
    k->head = first;
    k->ready += n;
    uint64_t one = 1;
    ssize_t w;
    do {
        w = write(k->efd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
    pthread_mutex_unlock(&k->mu);
}

static PyObject *Completions_drain(Completions *self, PyObject *unused) {
    (void)unused;
    core *k = self->k;
    uint64_t count;
    /* First the eventfd, then the list (see on_complete): EAGAIN is a spurious wake. */
    while (read(k->efd, &count, sizeof count) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&k->mu);
    slot *s = k->head;
    long n = k->ready;
    k->head = k->tail = NULL;
    k->ready = 0;
    pthread_mutex_unlock(&k->mu);
    if (s == NULL) return PyList_New(0);
    /* A slot leaves the list only once its answer is in the list returned: a read
     * whose answer cannot be built (no memory) goes back to the ring, with every one
     * after it, for the next drain(), never dropped (its caller would wait for good). */
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        put_back(k, s, n);
        return NULL;
    }
    Py_ssize_t taken = 0;
    while (s != NULL) {
        PyObject *item = answer_of(s);
        if (item == NULL) break;
        PyList_SET_ITEM(out, taken, item);
        taken++;
        slot *next = s->next;
        free_slot(s);
        s = next;
    }
    pthread_mutex_lock(&k->mu);
    k->undrained -= taken;
    pthread_mutex_unlock(&k->mu);
    if (s != NULL) {
        put_back(k, s, n - taken);
        if (taken == 0) {
            Py_DECREF(out); /* its items are all NULL: nothing to release */
            return NULL;
        }
        /* The answers built go on now, the rest at the next drain(); the list's slots
         * past them were never filled. */
        PyErr_Clear();
        Py_SET_SIZE(out, taken);
    }
    return out;
}

static PyObject *Completions_in_flight(Completions *self, PyObject *unused) {
    (void)unused;
    core *k = self->k;
    pthread_mutex_lock(&k->mu);
    long n = k->undrained;
    pthread_mutex_unlock(&k->mu);
    return PyLong_FromLong(n);
}

/* The longest wait_idle() turns into a deadline, about 31 years: a longer one (or an
 * infinite one) waits with none. Converting a double beyond time_t's range to time_t
 * is undefined (on x86-64 it gave a deadline in 1970: "not idle" at once). */
#define WAIT_S_MAX 1e9

static PyObject *wait_idle(core *k, double timeout_s) {
    if (!(timeout_s >= 0)) {
        PyErr_Format(PyExc_ValueError, "timeout_s must be >= 0, got %g", timeout_s);
        return NULL;
    }
    int bounded = timeout_s <= WAIT_S_MAX;
    struct timespec until = {0, 0};
    if (bounded) {
        clock_gettime(CLOCK_MONOTONIC, &until); /* the condition's clock (Completions_new) */
        time_t whole = (time_t)timeout_s;
        until.tv_sec += whole;
        until.tv_nsec += (long)((timeout_s - (double)whole) * 1e9);
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec += 1;
            until.tv_nsec -= 1000000000;
        }
    }
    int idle;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&k->mu);
    int rc = 0;
    while (k->in_librados > 0 && rc != ETIMEDOUT)
        rc = bounded ? pthread_cond_timedwait(&k->idle, &k->mu, &until)
                     : pthread_cond_wait(&k->idle, &k->mu);
    idle = k->in_librados == 0;
    pthread_mutex_unlock(&k->mu);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(idle);
}

static PyObject *Completions_wait_idle(Completions *self, PyObject *arg) {
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) return NULL;
    return wait_idle(self->k, t);
}

static PyObject *Completions_close(Completions *self, PyObject *arg) {
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&self->k->mu);
    self->k->closed = 1;
    pthread_mutex_unlock(&self->k->mu);
    return wait_idle(self->k, t);
}

static PyMethodDef Completions_methods[] = {
    {"fileno", (PyCFunction)Completions_fileno, METH_NOARGS,
     "fileno() -> the eventfd that becomes readable when reads have finished."},
    {"read", (PyCFunction)(void (*)(void))Completions_read, METH_FASTCALL,
     "read(ioctx, oid, offset, length, arg) -> 0, or minus an errno if not started."},
    {"drain", (PyCFunction)Completions_drain, METH_NOARGS,
     "drain() -> [(arg, rv, version, data, done_ns), ...]: finished reads, oldest first."},
    {"in_flight", (PyCFunction)Completions_in_flight, METH_NOARGS,
     "in_flight() -> reads started and not drained yet."},
    {"wait_idle", (PyCFunction)Completions_wait_idle, METH_O,
     "wait_idle(timeout_s) -> True once librados has called back for every read."},
    {"close", (PyCFunction)Completions_close, METH_O,
     "close(timeout_s) -> start no more reads, then wait_idle(timeout_s)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CompletionsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shuttle.store._aiodone.Completions",
    .tp_basicsize = sizeof(Completions),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "librados asynchronous reads completed through an eventfd, without the GIL.",
    .tp_new = Completions_new,
    .tp_dealloc = (destructor)Completions_dealloc,
    .tp_methods = Completions_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "shuttle.store._aiodone",
    "librados asynchronous reads whose completion never takes the GIL (reference: the "
    "ctypes path of shuttle/store/rados_aio.py).",
    -1, NULL,
};

PyMODINIT_FUNC PyInit__aiodone(void) {
    if (PyType_Ready(&CompletionsType) < 0) return NULL;
    if (enomem_rv == NULL && (enomem_rv = PyLong_FromLong(-ENOMEM)) == NULL) return NULL;
    if (empty_bytes == NULL && (empty_bytes = PyBytes_FromStringAndSize(NULL, 0)) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&CompletionsType);
    if (PyModule_AddObject(m, "Completions", (PyObject *)&CompletionsType) < 0) {
        Py_DECREF(&CompletionsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

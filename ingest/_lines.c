/* The per-push hot loop of ingest.dcgm_lines, compiled: cut a dcgm-exporter body at its values, and turn
 * a template's values into numbers.
 *
 * Every agent's push is cut and filled on the API's event loop; in Python these steps are a third of the
 * interpreter time a push holds the GIL for (regex split, join, a check regex and a float() per value).
 * Each function here returns exactly what the Python it replaces returns (ingest.dcgm_lines keeps that
 * Python as the fallback where this module was not built, and the tests compare the two on real,
 * synthetic, mutated and hostile bodies). Nothing here keeps state or releases the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* cut(data: bytes) -> (skeleton: bytes, lengths: bytes, values: list[bytes])
 *
 * re.compile(rb"\} ([^ \n]*)\n").split(data) gives texts and values alternately; this returns
 * b"".join(texts), array("I", map(len, texts)).tobytes() and the values. The match is found as the regex
 * engine finds it: at the leftmost "} ", the value runs to the first space or newline; it is a match only
 * where that stop is a newline, and the search goes on after it; otherwise it goes on one byte after the
 * brace. */
/* The texts between the values, joined into one buffer as they are found, and each one's length. */
typedef struct {
    char *out;
    Py_ssize_t written;
    uint32_t *lengths;
    Py_ssize_t count, cap;
} Texts;

static int
take_text(Texts *t, const char *from, Py_ssize_t len)
{
    if (t->count == t->cap) {
        Py_ssize_t cap = t->cap * 2;
        uint32_t *grown = PyMem_Realloc(t->lengths, cap * sizeof(uint32_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->lengths = grown;
        t->cap = cap;
    }
    memcpy(t->out + t->written, from, (size_t)len);
    t->written += len;
    t->lengths[t->count++] = (uint32_t)len;
    return 0;
}

static PyObject *
lines_cut(PyObject *self, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "cut() takes bytes");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    if (n > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "cut() takes at most 4 GiB");
        return NULL;
    }

    PyObject *values = PyList_New(0);
    PyObject *skeleton = PyBytes_FromStringAndSize(NULL, n); /* never longer than the body; shrunk below */
    Texts texts = {NULL, 0, PyMem_Malloc(64 * sizeof(uint32_t)), 0, 64};
    if (values == NULL || skeleton == NULL || texts.lengths == NULL) {
        goto fail;
    }
    texts.out = PyBytes_AS_STRING(skeleton);
    Py_ssize_t text_start = 0, i = 0;
    while (i + 1 < n) {
        const char *brace = memchr(data + i, '}', (size_t)(n - 1 - i));
        if (brace == NULL) {
            break;
        }
        Py_ssize_t at = brace - data;
        if (data[at + 1] != ' ') {
            i = at + 1;
            continue;
        }
        Py_ssize_t v = at + 2, end = v;
        while (end < n && data[end] != ' ' && data[end] != '\n') {
            end++;
        }
        if (end >= n || data[end] != '\n') {
            i = at + 1;
            continue;
        }
        /* the text before this match ends before its brace; the match takes "} ", the value and "\n" */
        if (take_text(&texts, data + text_start, at - text_start) < 0) {
            goto fail;
        }
        PyObject *value = PyBytes_FromStringAndSize(data + v, end - v);
        if (value == NULL || PyList_Append(values, value) < 0) {
            Py_XDECREF(value);
            goto fail;
        }
        Py_DECREF(value);
        text_start = end + 1;
        i = end + 1;
    }
    if (take_text(&texts, data + text_start, n - text_start) < 0) { /* the text after the last value */
        goto fail;
    }
    if (_PyBytes_Resize(&skeleton, texts.written) < 0) {
        skeleton = NULL;
        goto fail;
    }
    PyObject *lens = PyBytes_FromStringAndSize((const char *)texts.lengths, texts.count * (Py_ssize_t)sizeof(uint32_t));
    PyMem_Free(texts.lengths);
    if (lens == NULL) {
        Py_DECREF(skeleton);
        Py_DECREF(values);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(3, skeleton, lens, values);
    Py_DECREF(skeleton);
    Py_DECREF(lens);
    Py_DECREF(values);
    return result;

fail:
    Py_XDECREF(values);
    Py_XDECREF(skeleton);
    PyMem_Free(texts.lengths);
    return NULL;
}

/* The value of a plain decimal "[-]digits[.digits]" of at most 15 digits, exactly as float() gives it: the
 * digits make an integer below 2**53 and a power of ten up to 1e15 is a double exactly, so one IEEE
 * division rounds correctly (Clinger's fast path: W. D. Clinger, "How to Read Floating Point Numbers
 * Accurately", PLDI 1990). Returns 0 where the text is not of that form; the caller then asks CPython. */
static const double POW10[16] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};

static int
fast_decimal(const char *s, Py_ssize_t len, double *out)
{
    Py_ssize_t j = 0;
    int negative = 0, digits = 0, frac = -1;
    uint64_t m = 0;
    if (s[0] == '-') {
        negative = 1;
        j = 1;
    }
    if (j == len) {
        return 0;
    }
    for (; j < len; j++) {
        char c = s[j];
        if (c >= '0' && c <= '9') {
            if (++digits > 15) {
                return 0;
            }
            m = m * 10 + (uint64_t)(c - '0');
            if (frac >= 0) {
                frac++;
            }
        } else if (c == '.' && frac < 0) {
            frac = 0;
        } else {
            return 0;
        }
    }
    if (digits == 0) {
        return 0; /* "." or "-." */
    }
    double x = (double)m;
    if (frac > 0) {
        x /= POW10[frac];
    }
    *out = negative ? -x : x;
    return 1;
}

/* numbers(values: list[bytes], high: float) -> (list[float], float, list[int]) | None
 *
 * [float(v) for v in values] where every value is made only of the characters of a plain number
 * (0-9 e E . + -), as re.compile(rb"[0-9eE.+\-,]*").fullmatch(b",".join(values)) and float() check them,
 * with their minimum (inf for none) and the indices of those at or above ``high``; None where a value is
 * not plain, or float() refuses it ("1e", "", "+-1"). */
static PyObject *
lines_numbers(PyObject *self, PyObject *args)
{
    PyObject *values;
    double high;
    if (!PyArg_ParseTuple(args, "O!d", &PyList_Type, &values, &high)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *out = PyList_New(n);
    PyObject *above = PyList_New(0);
    if (out == NULL || above == NULL) {
        goto fail;
    }
    double low = Py_HUGE_VAL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PyList_GET_ITEM(values, k);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "numbers() takes a list of bytes");
            goto fail;
        }
        const char *s = PyBytes_AS_STRING(item);
        Py_ssize_t len = PyBytes_GET_SIZE(item);
        if (len == 0) {
            goto none;
        }
        for (Py_ssize_t j = 0; j < len; j++) {
            char c = s[j];
            if (!((c >= '0' && c <= '9') || c == 'e' || c == 'E' || c == '.' || c == '+' || c == '-')) {
                goto none;
            }
        }
        double x;
        if (!fast_decimal(s, len, &x)) {
            /* bytes objects end in NUL, and none of the characters above is one: the whole value is parsed */
            x = PyOS_string_to_double(s, NULL, NULL);
            if (x == -1.0 && PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError)) {
                    goto fail;
                }
                PyErr_Clear();
                goto none;
            }
        }
        PyObject *f = PyFloat_FromDouble(x);
        if (f == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(out, k, f);
        if (x < low) {
            low = x;
        }
        if (x >= high) {
            PyObject *at = PyLong_FromSsize_t(k);
            if (at == NULL || PyList_Append(above, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
        }
    }
    PyObject *result = Py_BuildValue("(OdO)", out, low, above);
    Py_DECREF(out);
    Py_DECREF(above);
    return result;

none:
    Py_DECREF(out);
    Py_DECREF(above);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    Py_XDECREF(above);
    return NULL;
}

/* scale_ints(values: list[float], at: list[int], factors: list[float]) -> int
 *
 * For each index i in ``at`` with its factor, values[i] = round(values[i] * factor) as an int, or None
 * where that falls outside int64 (ingest.dcgm_lines._scaled for an integer column); returns how many
 * became None. Python's round() of a float rounds half to even, as nearbyint() in the default rounding
 * mode does. */
static PyObject *
lines_scale_ints(PyObject *self, PyObject *args)
{
    PyObject *values, *at, *factors;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &values, &PyList_Type, &at, &PyList_Type, &factors)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values), m = PyList_GET_SIZE(at);
    if (PyList_GET_SIZE(factors) != m) {
        PyErr_SetString(PyExc_ValueError, "scale_ints(): at and factors differ in length");
        return NULL;
    }
    long lost = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyList_GET_ITEM(at, k));
        if (i == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (i < 0 || i >= n) {
            PyErr_SetString(PyExc_IndexError, "scale_ints(): index out of range");
            return NULL;
        }
        double factor = PyFloat_AsDouble(PyList_GET_ITEM(factors, k));
        double x = PyFloat_AsDouble(PyList_GET_ITEM(values, i));
        if (PyErr_Occurred()) {
            return NULL;
        }
        double r = nearbyint(x * factor);
        PyObject *v;
        /* -2**63 <= r < 2**63, both bounds exact in a double; NaN fails both */
        if (r >= -9223372036854775808.0 && r < 9223372036854775808.0) {
            v = PyLong_FromDouble(r);
            if (v == NULL) {
                return NULL;
            }
        } else {
            v = Py_NewRef(Py_None);
            lost++;
        }
        PyObject *old = PyList_GET_ITEM(values, i);
        PyList_SET_ITEM(values, i, v);
        Py_DECREF(old);
    }
    return PyLong_FromLong(lost);
}

static PyMethodDef lines_methods[] = {
    {"cut", lines_cut, METH_O, "The body's texts joined, their lengths (native uint32) and its values."},
    {"numbers", lines_numbers, METH_VARARGS, "The values as floats with their minimum and the indices at or above a bound, or None."},
    {"scale_ints", lines_scale_ints, METH_VARARGS, "Scale and round values in place; how many fell outside int64."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lines_module = {
    PyModuleDef_HEAD_INIT, "_lines", "ingest.dcgm_lines' per-push loop, compiled.", -1, lines_methods,
};

PyMODINIT_FUNC
PyInit__lines(void)
{
    return PyModule_Create(&lines_module);
}

/* capsvc.codec._native: rows read in C (the compiled build's fast path of
 * capsvc.codec.rows).
 *
 * Theory of operation
 * -------------------
 * A *program* is a StructPlan (capsvc.codec.plans) flattened for C: per field its kind,
 * offset, width, default bits (XOR), union discriminant, and the program of the struct a
 * struct, group or struct-list field holds. rows.py makes one per plan, on first use.
 *
 * The C reader handles the well-formed common case only, and *bails out* on anything
 * else: a far pointer, a pointer of the wrong kind, an object out of bounds, the traversal
 * budget or the nesting limit exceeded, Text that is not NUL-terminated or not UTF-8, a
 * list of structs that is not a composite list. Bailing out returns None with no
 * exception set and leaves the message's traversal budget as it was on entry; rows.py then
 * reads the same struct in Python from the start, which either reads what C could not
 * (far pointers, upgraded lists) or raises the precise DecodeError. So every rule of the
 * readers (capsvc.codec.reading) holds by construction: C charges each object to the
 * budget exactly as the Python readers do (a struct its words or 1, a byte list its words
 * or 1, a composite list its elements' words), counts nesting the same way, and a success
 * in C is a success in Python with the same row and the same budget left.
 *
 * Fields C does not read (pointer defaults, lists other than lists of structs,
 * capabilities, AnyPointers, float defaults, enum codes the schema does not know) are read
 * by calling back into rows.py (``_via_reader``), with the message's budget brought up to
 * date before the call and read back after it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Field kinds: capsvc.codec.plans, plus VIA (read through the generated reader). */
enum {
    K_VOID = 0,
    K_BOOL = 1,
    K_INT = 2,
    K_FLOAT = 3,
    K_ENUM = 4,
    K_TEXT = 5,
    K_DATA = 6,
    K_STRUCT = 7,
    K_LIST = 8, /* a list of structs: anything else is VIA */
    K_GROUP = 9,
    K_VIA = 100,
};

typedef struct {
    int kind;
    int width;
    int is_signed;
    int32_t offset; /* bytes (numbers, enums), bits (Bool), pointer slot (pointers) */
    int32_t disc;   /* union discriminant value, -1 outside a union */
    uint64_t xor_bits;
    PyObject *sub;     /* Program of a struct, group or struct-list field */
    PyObject *members; /* tuple of an enum's members by code */
    PyObject *field;   /* the FieldPlan, for VIA */
} Field;

typedef struct {
    PyObject_HEAD
    PyObject *plan;
    Field *fields;
    Py_ssize_t count;
    Py_ssize_t data_words;
    Py_ssize_t pointers;
    Py_ssize_t disc_at;
    int has_via; /* a field that may call back (VIA, or an enum) */
    int ready;
} Program;

static PyTypeObject ProgramType;

/* One read: the message, the one segment C reads pointers in, the budget left. */
typedef struct {
    PyObject *msg;
    PyObject *via;
    PyObject *segment; /* bytes */
    const uint8_t *base;
    Py_ssize_t words; /* whole words in the segment */
    Py_ssize_t si;
    long long budget;
    long long entry_budget;
    int bailed;
    int budget_written; /* msg.budget was set (before a callback): restore it on bail */
} Ctx;

static inline uint64_t
load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only: checked at import */
}

static inline uint32_t
load32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint16_t
load16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* The signed 30-bit word offset of a struct or list pointer. */
static inline int64_t
pointer_offset(uint64_t word)
{
    return (int64_t)(int32_t)(uint32_t)word >> 2;
}

static PyObject *
bail(Ctx *c)
{
    c->bailed = 1;
    return NULL;
}

static int
charge(Ctx *c, long long words)
{
    long long left = c->budget - (words > 0 ? words : 1);
    if (left < 0)
        return 0;
    c->budget = left;
    return 1;
}

static int
write_budget(Ctx *c, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL)
        return -1;
    int rc = PyObject_SetAttrString(c->msg, "budget", number);
    Py_DECREF(number);
    return rc;
}

static int
read_budget(PyObject *msg, long long *out)
{
    PyObject *number = PyObject_GetAttrString(msg, "budget");
    if (number == NULL)
        return -1;
    long long value = PyLong_AsLongLong(number);
    Py_DECREF(number);
    if (value == -1 && PyErr_Occurred())
        return -1;
    *out = value;
    return 0;
}

static PyObject *read_row(Ctx *c, Program *p, PyObject *dseg, Py_ssize_t data,
                          Py_ssize_t data_len, Py_ssize_t ptr, Py_ssize_t pend, long depth);

/* ``_via_reader(msg, si, seg, data, ptr, pend, plan, depth, field)`` in rows.py. */
static PyObject *
call_via(Ctx *c, Program *p, Field *f, PyObject *dseg, Py_ssize_t data, Py_ssize_t ptr,
         Py_ssize_t pend, long depth)
{
    if (write_budget(c, c->budget) < 0)
        return NULL;
    c->budget_written = 1;
    PyObject *result = PyObject_CallFunction(c->via, "OnOnnnOlO", c->msg, c->si, dseg, data,
                                             ptr, pend, p->plan, depth, f->field);
    if (result == NULL)
        return NULL;
    if (read_budget(c->msg, &c->budget) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *
read_int(const uint8_t *at, Field *f, int present)
{
    uint64_t raw = 0;
    if (present) {
        switch (f->width) {
        case 1: raw = at[0]; break;
        case 2: raw = load16(at); break;
        case 4: raw = load32(at); break;
        default: raw = load64(at); break;
        }
    }
    raw ^= f->xor_bits;
    switch (f->width) {
    case 1:
        raw &= 0xFF;
        return PyLong_FromLong(f->is_signed ? (long)(int8_t)raw : (long)raw);
    case 2:
        raw &= 0xFFFF;
        return PyLong_FromLong(f->is_signed ? (long)(int16_t)raw : (long)raw);
    case 4:
        raw &= 0xFFFFFFFFu;
        return PyLong_FromLongLong(f->is_signed ? (long long)(int32_t)raw : (long long)raw);
    default:
        if (f->is_signed)
            return PyLong_FromLongLong((long long)(int64_t)raw);
        return PyLong_FromUnsignedLongLong(raw);
    }
}

/* A Text or Data field: "" / b"" for a null pointer. */
static PyObject *
read_bytes_field(Ctx *c, Py_ssize_t w, int is_text)
{
    if (w < 0)
        return is_text ? PyUnicode_New(0, 0) : PyBytes_FromStringAndSize(NULL, 0);
    uint64_t word = load64(c->base + (w << 3));
    if (word == 0)
        return is_text ? PyUnicode_New(0, 0) : PyBytes_FromStringAndSize(NULL, 0);
    if ((word & 0x700000003ull) != 0x200000001ull)
        return bail(c); /* far, or not a byte list: Python follows it or names the fault */
    int64_t count = (int64_t)(word >> 35);
    int64_t start = (int64_t)w + 1 + pointer_offset(word);
    int64_t words = (count + 7) >> 3;
    if (start < 0 || start + words > c->words || !charge(c, words))
        return bail(c);
    const uint8_t *bytes = c->base + (start << 3);
    if (!is_text)
        return PyBytes_FromStringAndSize((const char *)bytes, (Py_ssize_t)count);
    if (count == 0 || bytes[count - 1] != 0)
        return bail(c);
    PyObject *text = PyUnicode_DecodeUTF8((const char *)bytes, (Py_ssize_t)(count - 1), NULL);
    if (text == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return NULL;
        PyErr_Clear();
        return bail(c); /* Python raises DecodeError naming the fault */
    }
    return text;
}

/* A struct field: None for a null pointer. */
static PyObject *
read_struct_field(Ctx *c, Program *target, Py_ssize_t w, long depth)
{
    if (w < 0)
        Py_RETURN_NONE;
    uint64_t word = load64(c->base + (w << 3));
    if (word == 0)
        Py_RETURN_NONE;
    if ((word & 3) != 0 || depth <= 0)
        return bail(c);
    int64_t data_words = (int64_t)((word >> 32) & 0xFFFF);
    int64_t pointers = (int64_t)(word >> 48);
    int64_t start = (int64_t)w + 1 + pointer_offset(word);
    if (start < 0 || start + data_words + pointers > c->words
        || !charge(c, data_words + pointers))
        return bail(c);
    Py_ssize_t ptr = (Py_ssize_t)(start + data_words);
    return read_row(c, target, c->segment, (Py_ssize_t)(start << 3), (Py_ssize_t)(data_words << 3),
                    ptr, ptr + (Py_ssize_t)pointers, depth - 1);
}

/* ``count`` elements of ``size`` words each from word ``start``, already checked and
 * charged; ``depth`` is the nesting left for each element. */
static PyObject *
read_elements(Ctx *c, Program *target, Py_ssize_t start, Py_ssize_t count, Py_ssize_t size,
              Py_ssize_t data_words, Py_ssize_t pointers, long depth)
{
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t index = 0; index < count; index++) {
        Py_ssize_t at = start + index * size;
        Py_ssize_t ptr = at + data_words;
        PyObject *row = read_row(c, target, c->segment, at << 3, data_words << 3, ptr,
                                 ptr + pointers, depth);
        if (row == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, index, row);
    }
    return list;
}

/* A list-of-structs field: [] for a null pointer; a composite list read here, anything
 * else (far pointers, upgraded primitive lists, faults) left to Python. */
static PyObject *
read_list_field(Ctx *c, Program *target, Py_ssize_t w, long depth)
{
    if (w < 0)
        return PyList_New(0);
    uint64_t word = load64(c->base + (w << 3));
    if (word == 0)
        return PyList_New(0);
    if ((word & 3) != 1 || ((word >> 32) & 7) != 7 || depth <= 0)
        return bail(c);
    int64_t total = (int64_t)(word >> 35);
    int64_t start = (int64_t)w + 1 + pointer_offset(word);
    if (start < 0 || start + 1 + total > c->words)
        return bail(c);
    uint64_t tag = load64(c->base + (start << 3));
    int64_t elements = (int64_t)((tag & 0xFFFFFFFFu) >> 2);
    int64_t data_words = (int64_t)((tag >> 32) & 0xFFFF);
    int64_t pointers = (int64_t)(tag >> 48);
    int64_t size = data_words + pointers;
    if ((tag & 3) || size == 0 || elements * size > total)
        return bail(c);
    long long left = c->budget - elements * size;
    if (left < 0)
        return bail(c);
    c->budget = left;
    return read_elements(c, target, (Py_ssize_t)(start + 1), (Py_ssize_t)elements,
                         (Py_ssize_t)size, (Py_ssize_t)data_words, (Py_ssize_t)pointers,
                         depth - 1);
}

/* The row of a struct of ``p``: its data section is ``data_len`` bytes at byte ``data`` of
 * ``dseg`` (shorter than the schema's for an older writer: the missing fields read as
 * their defaults), its pointers words ``ptr`` to ``pend`` of the segment. */
static PyObject *
read_row(Ctx *c, Program *p, PyObject *dseg, Py_ssize_t data, Py_ssize_t data_len,
         Py_ssize_t ptr, Py_ssize_t pend, long depth)
{
    if (!p->ready)
        return bail(c);
    if (p->has_via && data_len < (p->data_words << 3))
        return bail(c); /* the generated reader needs the schema's section: Python pads it */
    if (Py_EnterRecursiveCall(" reading a row"))
        return NULL;
    const uint8_t *section = (const uint8_t *)PyBytes_AS_STRING(dseg) + data;
    long disc = -1;
    if (p->disc_at >= 0)
        disc = p->disc_at + 2 <= data_len ? (long)load16(section + p->disc_at) : 0;
    PyObject *row = PyTuple_New(p->count);
    if (row == NULL)
        goto fail;
    for (Py_ssize_t index = 0; index < p->count; index++) {
        Field *f = &p->fields[index];
        PyObject *value;
        if (f->disc >= 0 && f->disc != disc) {
            value = Py_None; /* a union member not set */
            Py_INCREF(value);
            PyTuple_SET_ITEM(row, index, value);
            continue;
        }
        Py_ssize_t slot = ptr + f->offset;
        Py_ssize_t w = slot < pend ? slot : -1;
        switch (f->kind) {
        case K_INT:
            value = read_int(section + f->offset, f, f->offset + f->width <= data_len);
            break;
        case K_BOOL: {
            int bit = 0;
            if ((f->offset >> 3) < data_len)
                bit = (section[f->offset >> 3] >> (f->offset & 7)) & 1;
            value = (bit ^ (int)f->xor_bits) ? Py_True : Py_False;
            Py_INCREF(value);
            break;
        }
        case K_FLOAT: {
            int present = f->offset + f->width <= data_len;
            if (f->width == 4) {
                float single = 0;
                if (present)
                    memcpy(&single, section + f->offset, 4);
                value = PyFloat_FromDouble((double)single);
            }
            else {
                double dbl = 0;
                if (present)
                    memcpy(&dbl, section + f->offset, 8);
                value = PyFloat_FromDouble(dbl);
            }
            break;
        }
        case K_ENUM: {
            unsigned code = f->offset + 2 <= data_len ? load16(section + f->offset) : 0;
            code = (code ^ (unsigned)f->xor_bits) & 0xFFFF;
            if (code < (unsigned)PyTuple_GET_SIZE(f->members)) {
                value = PyTuple_GET_ITEM(f->members, code);
                Py_INCREF(value);
            }
            else {
                value = call_via(c, p, f, dseg, data, ptr, pend, depth);
            }
            break;
        }
        case K_TEXT:
            value = read_bytes_field(c, w, 1);
            break;
        case K_DATA:
            value = read_bytes_field(c, w, 0);
            break;
        case K_STRUCT:
            value = read_struct_field(c, (Program *)f->sub, w, depth);
            break;
        case K_LIST:
            value = read_list_field(c, (Program *)f->sub, w, depth);
            break;
        case K_GROUP:
            value = read_row(c, (Program *)f->sub, dseg, data, data_len, ptr, pend, depth);
            break;
        case K_VOID:
            value = f->disc >= 0 ? Py_True : Py_None; /* a Void union member set: True */
            Py_INCREF(value);
            break;
        default:
            value = call_via(c, p, f, dseg, data, ptr, pend, depth);
            break;
        }
        if (value == NULL) {
            Py_DECREF(row);
            goto fail;
        }
        PyTuple_SET_ITEM(row, index, value);
    }
    Py_LeaveRecursiveCall();
    return row;
fail:
    Py_LeaveRecursiveCall();
    return NULL;
}

/* ---------------------------------------------------------------- entry points */
static int
open_ctx(Ctx *c, PyObject *msg, Py_ssize_t si, PyObject *via)
{
    memset(c, 0, sizeof(*c));
    c->msg = msg;
    c->via = via;
    c->si = si;
    PyObject *segments = PyObject_GetAttrString(msg, "segments");
    if (segments == NULL)
        return -1;
    if (!PyList_Check(segments) || si < 0 || si >= PyList_GET_SIZE(segments)) {
        Py_DECREF(segments);
        PyErr_SetString(PyExc_ValueError, "no such segment");
        return -1;
    }
    PyObject *segment = PyList_GET_ITEM(segments, si);
    Py_DECREF(segments); /* the message keeps its segment alive while we read */
    if (!PyBytes_CheckExact(segment)) {
        PyErr_SetString(PyExc_TypeError, "a message segment must be bytes");
        return -1;
    }
    c->segment = segment;
    c->base = (const uint8_t *)PyBytes_AS_STRING(segment);
    c->words = PyBytes_GET_SIZE(segment) >> 3;
    if (read_budget(msg, &c->budget) < 0)
        return -1;
    c->entry_budget = c->budget;
    return 0;
}

/* What a read returns: the value with the budget written back, or None (a bail, the
 * budget as it was on entry), or NULL (an exception). */
static PyObject *
close_ctx(Ctx *c, PyObject *result)
{
    if (result == NULL) {
        if (!c->bailed || PyErr_Occurred())
            return NULL;
        if (c->budget_written && write_budget(c, c->entry_budget) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (write_budget(c, c->budget) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *
py_struct_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* (program, msg, si, seg, data, ptr, pend, depth, via) */
    if (nargs != 9 || !PyObject_TypeCheck(args[0], &ProgramType) || !PyBytes_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "struct_row(program, msg, si, seg, data, ptr, pend, depth, via)");
        return NULL;
    }
    Program *p = (Program *)args[0];
    Py_ssize_t si = PyLong_AsSsize_t(args[2]);
    Py_ssize_t data = PyLong_AsSsize_t(args[4]);
    Py_ssize_t ptr = PyLong_AsSsize_t(args[5]);
    Py_ssize_t pend = PyLong_AsSsize_t(args[6]);
    long depth = PyLong_AsLong(args[7]);
    if (PyErr_Occurred())
        return NULL;
    Ctx c;
    if (open_ctx(&c, args[1], si, args[8]) < 0)
        return NULL;
    Py_ssize_t data_len = p->data_words << 3;
    if (data < 0 || data + data_len > PyBytes_GET_SIZE(args[3]) || ptr < 0 || pend < ptr
        || pend > c.words)
        Py_RETURN_NONE; /* not the reader's invariant: let Python read it */
    return close_ctx(&c, read_row(&c, p, args[3], data, data_len, ptr, pend, depth));
}

static PyObject *
py_element_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* (program, msg, si, start, count, words, data_words, pointers, depth, via) */
    if (nargs != 10 || !PyObject_TypeCheck(args[0], &ProgramType)) {
        PyErr_SetString(PyExc_TypeError,
                        "element_rows(program, msg, si, start, count, words, data_words, pointers, depth, via)");
        return NULL;
    }
    Program *p = (Program *)args[0];
    Py_ssize_t si = PyLong_AsSsize_t(args[2]);
    Py_ssize_t start = PyLong_AsSsize_t(args[3]);
    Py_ssize_t count = PyLong_AsSsize_t(args[4]);
    Py_ssize_t size = PyLong_AsSsize_t(args[5]);
    Py_ssize_t data_words = PyLong_AsSsize_t(args[6]);
    Py_ssize_t pointers = PyLong_AsSsize_t(args[7]);
    long depth = PyLong_AsLong(args[8]);
    if (PyErr_Occurred())
        return NULL;
    Ctx c;
    if (open_ctx(&c, args[1], si, args[9]) < 0)
        return NULL;
    if (start < 0 || count < 0 || size <= 0 || data_words < 0 || pointers < 0
        || data_words + pointers > size || start + count * size > c.words)
        Py_RETURN_NONE;
    return close_ctx(&c, read_elements(&c, p, start, count, size, data_words, pointers, depth));
}

/* ---------------------------------------------------------------- the Program type */
static void
clear_fields(Program *p)
{
    if (p->fields == NULL)
        return;
    for (Py_ssize_t i = 0; i < p->count; i++) {
        Py_CLEAR(p->fields[i].sub);
        Py_CLEAR(p->fields[i].members);
        Py_CLEAR(p->fields[i].field);
    }
    PyMem_Free(p->fields);
    p->fields = NULL;
    p->count = 0;
}

static int
Program_init(Program *self, PyObject *args, PyObject *kwds)
{
    PyObject *plan;
    if (!PyArg_ParseTuple(args, "O", &plan))
        return -1;
    Py_INCREF(plan);
    Py_XSETREF(self->plan, plan);
    return 0;
}

/* program.set(data_words, pointers, disc_at, fields): each field a tuple
 * (kind, offset, width, signed, xor_bits, disc, sub, members, field). */
static PyObject *
Program_set(Program *self, PyObject *args)
{
    Py_ssize_t data_words, pointers, disc_at;
    PyObject *fields;
    if (!PyArg_ParseTuple(args, "nnnO!", &data_words, &pointers, &disc_at, &PyTuple_Type, &fields))
        return NULL;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "a program is set once");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    Field *made = PyMem_Calloc(count ? count : 1, sizeof(Field));
    if (made == NULL)
        return PyErr_NoMemory();
    int has_via = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Field *f = &made[i];
        PyObject *sub, *members, *field;
        unsigned long long xor_bits;
        int kind, width, is_signed, offset, disc;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "iiipKiOOO", &kind, &offset, &width,
                              &is_signed, &xor_bits, &disc, &sub, &members, &field))
            goto fail;
        int needs_sub = kind == K_STRUCT || kind == K_GROUP || kind == K_LIST;
        if ((needs_sub && !PyObject_TypeCheck(sub, &ProgramType))
            || (kind == K_ENUM && !PyTuple_Check(members)) || offset < 0
            || (kind == K_INT && width != 1 && width != 2 && width != 4 && width != 8)
            || (kind == K_FLOAT && width != 4 && width != 8)) {
            PyErr_Format(PyExc_ValueError, "field %zd of a program is malformed", i);
            goto fail;
        }
        f->kind = kind;
        f->offset = offset;
        f->width = width;
        f->is_signed = is_signed;
        f->xor_bits = xor_bits;
        f->disc = disc;
        f->sub = needs_sub ? Py_NewRef(sub) : NULL;
        f->members = kind == K_ENUM ? Py_NewRef(members) : NULL;
        f->field = Py_NewRef(field);
        if (kind == K_VIA || kind == K_ENUM)
            has_via = 1;
    }
    self->fields = made;
    self->count = count;
    self->data_words = data_words;
    self->pointers = pointers;
    self->disc_at = disc_at;
    self->has_via = has_via;
    self->ready = 1;
    Py_RETURN_NONE;
fail:
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_CLEAR(made[i].sub);
        Py_CLEAR(made[i].members);
        Py_CLEAR(made[i].field);
    }
    PyMem_Free(made);
    return NULL;
}

static int
Program_traverse(Program *self, visitproc visit, void *arg)
{
    Py_VISIT(self->plan);
    for (Py_ssize_t i = 0; i < self->count; i++) {
        Py_VISIT(self->fields[i].sub);
        Py_VISIT(self->fields[i].members);
        Py_VISIT(self->fields[i].field);
    }
    return 0;
}

static int
Program_clear(Program *self)
{
    self->ready = 0;
    Py_CLEAR(self->plan);
    clear_fields(self);
    return 0;
}

static void
Program_dealloc(Program *self)
{
    PyObject_GC_UnTrack(self);
    Program_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Program_methods[] = {
    {"set", (PyCFunction)Program_set, METH_VARARGS, "Set the fields (once)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "capsvc.codec._native.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A StructPlan flattened for the C row reader.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Program_init,
    .tp_traverse = (traverseproc)Program_traverse,
    .tp_clear = (inquiry)Program_clear,
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_methods = Program_methods,
};

static PyMethodDef module_methods[] = {
    {"struct_row", (PyCFunction)(void (*)(void))py_struct_row, METH_FASTCALL,
     "The row of one struct, or None to read it in Python."},
    {"element_rows", (PyCFunction)(void (*)(void))py_element_rows, METH_FASTCALL,
     "The rows of a checked list of structs, or None to read them in Python."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "capsvc.codec._native",
    "Rows read in C: the compiled build's fast path of capsvc.codec.rows.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        PyErr_SetString(PyExc_ImportError, "capsvc.codec._native reads little-endian words");
        return NULL;
    }
    if (PyType_Ready(&ProgramType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(&ProgramType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

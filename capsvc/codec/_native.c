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
#include <limits.h>
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
    int orig_kind; /* the plan's kind (a VIA field's real one) */
    int width;
    int is_signed;
    int32_t offset; /* bytes (numbers, enums), bits (Bool), pointer slot (pointers) */
    int32_t disc;   /* union discriminant value, -1 outside a union */
    uint64_t xor_bits;
    PyObject *sub;     /* Program of a struct, group or struct-list field */
    PyObject *members; /* tuple of an enum's members by code */
    PyObject *field;   /* the FieldPlan, for VIA */
    PyObject *key;     /* the field's Python keyword, and its schema name (a dict's keys) */
    PyObject *name;
    Py_ssize_t row_at; /* where its value (a spliced group's first) is in a row */
    int spliced;       /* a group whose fields take its place in the row */
    /* In a program's ``flat`` list: the discriminant of the union the field is in (its
     * struct's or group's), and the program it belongs to (borrowed: its parent holds
     * it), whose plan reads it through Python. */
    Py_ssize_t disc_at;
    PyObject *owner;
} Field;

typedef struct {
    PyObject_HEAD
    PyObject *plan;
    Field *fields;
    Py_ssize_t count;
    Py_ssize_t width; /* the values of a row (StructPlan.row_width) */
    Py_ssize_t data_words;
    Py_ssize_t pointers;
    Py_ssize_t disc_at;
    int ready;
    /* The fields whose pointer targets the encoder appends, in the order the Python
     * encoder appends them (capsvc.codec.values): by pointer offset for an in-order plan,
     * else schema order (groups among them). */
    Py_ssize_t *pointer_order;
    Py_ssize_t pointer_count;
    /* What the row reader walks: the fields with each spliced group's own (flat) fields
     * in its place (their ``row_at`` made the struct's), so a row is read in one loop,
     * not a call per group. Borrowed references. */
    Field *flat;
    Py_ssize_t flat_count;
    int flat_has_via; /* a field that may call back (VIA, or an enum) */
    /* What the encoder walks for a row: the indices in ``flat`` of the fields that may
     * hold a pointer, in ``pointer_order``'s order with each spliced group's own in its
     * place (so a row is encoded in two loops, not two calls per group). */
    Py_ssize_t *flat_pointers;
    Py_ssize_t flat_pointer_count;
    /* The size of the last message encoded from this root, and a little more: where the
     * next one's buffer starts, rather than growing by doubling (a 160 KB message grew
     * through ten reallocations). */
    Py_ssize_t size_hint;
} Program;

static PyTypeObject ProgramType;

/* Attribute names, interned once at import (a C string would make a str per lookup). */
static PyObject *str_budget;

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
    /* root_row's: no message object until a field is read through Python, then one made
     * by ``make_msg(segment, traversal_limit, nesting_limit)`` and owned here. */
    PyObject *make_msg;
    long nesting_limit;
    int owns_msg;
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
    int rc = PyObject_SetAttr(c->msg, str_budget, number);
    Py_DECREF(number);
    return rc;
}

static int
read_budget(PyObject *msg, long long *out)
{
    PyObject *number = PyObject_GetAttr(msg, str_budget);
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
static int read_into(Ctx *c, Program *p, PyObject *row, Py_ssize_t base, PyObject *dseg,
                     Py_ssize_t data, Py_ssize_t data_len, Py_ssize_t ptr, Py_ssize_t pend,
                     long depth);

/* ``_via_reader(msg, si, seg, data, ptr, pend, plan, depth, field)`` in rows.py. */
static PyObject *
call_via(Ctx *c, Program *p, Field *f, PyObject *dseg, Py_ssize_t data, Py_ssize_t ptr,
         Py_ssize_t pend, long depth)
{
    if (c->msg == NULL) { /* root_row: the message object a Python read needs, now */
        c->msg = PyObject_CallFunction(c->make_msg, "OLl", c->segment, c->entry_budget,
                                       c->nesting_limit);
        if (c->msg == NULL)
            return NULL;
        c->owns_msg = 1;
    }
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
    /* The C stack, guarded where pointers nest (a group is a fixed depth in the schema). */
    if (Py_EnterRecursiveCall(" reading a row"))
        return NULL;
    PyObject *row = read_row(c, target, c->segment, (Py_ssize_t)(start << 3),
                             (Py_ssize_t)(data_words << 3), ptr, ptr + (Py_ssize_t)pointers,
                             depth - 1);
    Py_LeaveRecursiveCall();
    return row;
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
    if (Py_EnterRecursiveCall(" reading a row"))
        return NULL;
    PyObject *rows = read_elements(c, target, (Py_ssize_t)(start + 1), (Py_ssize_t)elements,
                                   (Py_ssize_t)size, (Py_ssize_t)data_words,
                                   (Py_ssize_t)pointers, depth - 1);
    Py_LeaveRecursiveCall();
    return rows;
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
    PyObject *row = PyTuple_New(p->width);
    if (row == NULL)
        return NULL;
    if (read_into(c, p, row, 0, dseg, data, data_len, ptr, pend, depth) < 0) {
        Py_DECREF(row); /* (a tuple partly filled: its empty items are NULL) */
        return NULL;
    }
    return row;
}

/* The values of a struct of ``p`` into ``row`` from item ``base`` on (a spliced group's
 * fields land in its struct's row); -1 on a bail or an error. */
static int
read_into(Ctx *c, Program *p, PyObject *row, Py_ssize_t base, PyObject *dseg,
          Py_ssize_t data, Py_ssize_t data_len, Py_ssize_t ptr, Py_ssize_t pend, long depth)
{
    if (!p->ready || base < 0 || base + p->width > PyTuple_GET_SIZE(row)) {
        bail(c);
        return -1;
    }
    if (p->flat_has_via && data_len < (p->data_words << 3)) {
        bail(c); /* the generated reader needs the schema's section: Python pads it */
        return -1;
    }
    const uint8_t *section = (const uint8_t *)PyBytes_AS_STRING(dseg) + data;
    Py_ssize_t disc_at = -1; /* the discriminant last read, and its value */
    long disc = -1;
    for (Py_ssize_t index = 0; index < p->flat_count; index++) {
        Field *f = &p->flat[index];
        Py_ssize_t at = base + f->row_at;
        PyObject *value;
        if (f->disc >= 0) {
            if (f->disc_at != disc_at) {
                disc_at = f->disc_at;
                disc = disc_at + 2 <= data_len ? (long)load16(section + disc_at) : 0;
            }
            if (f->disc != disc) {
                value = Py_None; /* a union member not set */
                Py_INCREF(value);
                PyTuple_SET_ITEM(row, at, value);
                continue;
            }
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
                value = call_via(c, (Program *)f->owner, f, dseg, data, ptr, pend, depth);
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
        case K_GROUP: /* a union member (a spliced group's fields are in ``flat``) */
            value = read_row(c, (Program *)f->sub, dseg, data, data_len, ptr, pend, depth);
            break;
        case K_VOID:
            value = f->disc >= 0 ? Py_True : Py_None; /* a Void union member set: True */
            Py_INCREF(value);
            break;
        default:
            value = call_via(c, (Program *)f->owner, f, dseg, data, ptr, pend, depth);
            break;
        }
        if (value == NULL)
            return -1;
        PyTuple_SET_ITEM(row, at, value);
    }
    return 0;
}

/* ---------------------------------------------------------------- entry points */
/* ``segment`` is segment ``si`` of ``msg`` and ``budget`` its traversal budget left, as the
 * compiled caller read them (native attribute reads there; a Python attribute lookup
 * each here). */
static int
open_ctx(Ctx *c, PyObject *msg, Py_ssize_t si, PyObject *via, PyObject *segment,
         PyObject *budget)
{
    memset(c, 0, sizeof(*c));
    c->msg = msg;
    c->via = via;
    c->si = si;
    if (!PyBytes_CheckExact(segment)) {
        PyErr_SetString(PyExc_TypeError, "a message segment must be bytes");
        return -1;
    }
    c->budget = PyLong_AsLongLong(budget);
    if (c->budget == -1 && PyErr_Occurred())
        return -1;
    /* Held for the read: a field read through Python code may run anything. */
    c->segment = Py_NewRef(segment);
    c->base = (const uint8_t *)PyBytes_AS_STRING(segment);
    c->words = PyBytes_GET_SIZE(segment) >> 3;
    c->entry_budget = c->budget;
    return 0;
}

static void
release_ctx(Ctx *c)
{
    Py_CLEAR(c->segment);
}

/* What a read returns: the value with the budget written back (when it moved), or None
 * (a bail, the budget as it was on entry), or NULL (an exception). */
static PyObject *
close_ctx(Ctx *c, PyObject *result)
{
    release_ctx(c);
    if (result == NULL) {
        if (!c->bailed || PyErr_Occurred())
            return NULL;
        if (c->budget_written && write_budget(c, c->entry_budget) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if ((c->budget != c->entry_budget || c->budget_written)
        && write_budget(c, c->budget) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* ``count`` integer arguments as Py_ssize_t; -1 with the exception set. */
static int
ssize_args(PyObject *const *args, Py_ssize_t count, Py_ssize_t *out)
{
    for (Py_ssize_t index = 0; index < count; index++) {
        out[index] = PyLong_AsSsize_t(args[index]);
        if (out[index] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *
py_struct_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* (program, msg, segment, budget, si, seg, data, ptr, pend, depth, via) */
    if (nargs != 11 || !PyObject_TypeCheck(args[0], &ProgramType) || !PyBytes_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "struct_row(program, msg, segment, budget, si, seg, data, ptr, pend, depth, via)");
        return NULL;
    }
    Program *p = (Program *)args[0];
    Py_ssize_t n[4]; /* data, ptr, pend, depth */
    Py_ssize_t si;
    if (ssize_args(args + 6, 4, n) < 0 || ssize_args(args + 4, 1, &si) < 0)
        return NULL;
    Py_ssize_t data = n[0], ptr = n[1], pend = n[2];
    long depth = (long)n[3];
    Ctx c;
    if (open_ctx(&c, args[1], si, args[10], args[2], args[3]) < 0)
        return NULL;
    Py_ssize_t data_len = p->data_words << 3;
    if (data < 0 || data + data_len > PyBytes_GET_SIZE(args[5]) || ptr < 0 || pend < ptr
        || pend > c.words) {
        release_ctx(&c);
        Py_RETURN_NONE; /* not the reader's invariant: let Python read it */
    }
    return close_ctx(&c, read_row(&c, p, args[5], data, data_len, ptr, pend, depth));
}

static PyObject *
py_element_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* (program, msg, segment, budget, si, start, count, words, data_words, pointers,
     * depth, via) */
    if (nargs != 12 || !PyObject_TypeCheck(args[0], &ProgramType)) {
        PyErr_SetString(PyExc_TypeError,
                        "element_rows(program, msg, segment, budget, si, start, count, words,"
                        " data_words, pointers, depth, via)");
        return NULL;
    }
    Program *p = (Program *)args[0];
    Py_ssize_t n[7]; /* si, start, count, words, data_words, pointers, depth */
    if (ssize_args(args + 4, 7, n) < 0)
        return NULL;
    Py_ssize_t start = n[1], count = n[2], size = n[3], data_words = n[4], pointers = n[5];
    long depth = (long)n[6];
    Ctx c;
    if (open_ctx(&c, args[1], n[0], args[11], args[2], args[3]) < 0)
        return NULL;
    if (start < 0 || count < 0 || size <= 0 || data_words < 0 || pointers < 0
        || data_words + pointers > size || start + count * size > c.words) {
        release_ctx(&c);
        Py_RETURN_NONE;
    }
    return close_ctx(&c, read_elements(&c, p, start, count, size, data_words, pointers, depth));
}

/* ``root_row(program, segment, traversal_limit, nesting_limit, via, make_msg)``: the row
 * of the root struct of a one-segment message whose words are ``segment`` (bytes, no
 * segment table), as ``T.row(T.read([segment]))`` reads it, charged to a budget of its
 * own; None (a bail) for anything else, and Python reads the same message from the
 * start (a null root too: Python's empty reader gives its defaults). No message object
 * is made unless a field is read through Python (``via``): ``make_msg(segment,
 * traversal_limit, nesting_limit)`` makes it then, as ``T.read`` would have. */
static PyObject *
py_root_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyObject_TypeCheck(args[0], &ProgramType) || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "root_row(program, segment: bytes, traversal_limit,"
                                         " nesting_limit, via, make_msg)");
        return NULL;
    }
    Program *p = (Program *)args[0];
    long long budget = PyLong_AsLongLong(args[2]);
    if (budget == -1 && PyErr_Occurred())
        return NULL;
    long nesting = PyLong_AsLong(args[3]);
    if (nesting == -1 && PyErr_Occurred())
        return NULL;
    Ctx c;
    memset(&c, 0, sizeof(c));
    c.via = args[4];
    c.make_msg = args[5];
    c.nesting_limit = nesting;
    c.segment = Py_NewRef(args[1]);
    c.base = (const uint8_t *)PyBytes_AS_STRING(args[1]);
    c.words = PyBytes_GET_SIZE(args[1]) >> 3;
    c.budget = c.entry_budget = budget;
    PyObject *row = NULL;
    /* The root pointer (word 0), as reading.locate_struct takes it: a near struct pointer
     * within the segment and the budget, one level of nesting for the root itself. */
    uint64_t word = c.words >= 1 ? load64(c.base) : 0;
    if (word != 0 && (word & 3) == 0 && nesting > 0) {
        int64_t data_words = (int64_t)((word >> 32) & 0xFFFF);
        int64_t pointers = (int64_t)(word >> 48);
        int64_t start = 1 + pointer_offset(word);
        if (start >= 0 && start + data_words + pointers <= c.words
            && charge(&c, data_words + pointers)) {
            Py_ssize_t ptr = (Py_ssize_t)(start + data_words);
            row = read_row(&c, p, c.segment, (Py_ssize_t)(start << 3),
                           (Py_ssize_t)(data_words << 3), ptr, ptr + (Py_ssize_t)pointers,
                           nesting - 1);
        }
        else
            c.bailed = 1;
    }
    else
        c.bailed = 1;
    release_ctx(&c);
    if (c.owns_msg)
        Py_DECREF(c.msg); /* (nobody reads its budget after us: it was ours alone) */
    if (row == NULL && c.bailed && !PyErr_Occurred())
        Py_RETURN_NONE;
    return row;
}

/* ---------------------------------------------------------------- the encoder
 *
 * ``encode_root(program, values, missing)``: a whole message (a bytearray: the root
 * pointer, then the root struct and everything below it) from ``values``: the root's
 * values in schema order as generated ``new_message`` passes them (a list, ``missing``
 * where a field is not given), a row (a tuple, None where a field is not given), or a
 * dict of fields by either of their names. Nested structs, groups and list elements are
 * rows or dicts too. It lays the message out exactly as capsvc.codec.values does, byte for
 * byte: the struct's sections, then its pointer targets in the same order, a composite
 * list's sections before any element's targets. ``encode_framed`` (same arguments) gives
 * the same message as its bytes in the standard stream framing: what ``T.encode`` returns,
 * written in place behind the segment table's word, so no copy is made.
 *
 * As the reader does, it takes the common case only and *bails out* (returns None, and
 * nothing was written anywhere) on everything else: a reader or builder for a struct, a
 * key that names no field, a value of a wrong type or out of range, two union members, a
 * capability, an AnyPointer, a list other than a list of structs, a struct field with a
 * schema default. Python then encodes the same values from the start, and names the
 * fault if there is one. */

typedef struct {
    /* What is being written: a bytearray (``encode_root``: a builder's segment), or a
     * bytes object (``encode_framed``: the message's bytes, returned as they are, with
     * no copy) whose first ``head`` bytes are left for the segment table. ``buf`` is
     * the segment's first byte, ``len`` and ``cap`` count from there. */
    PyObject *array;
    int is_bytes;
    Py_ssize_t head;
    uint8_t *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
    PyObject *missing;
    int bailed;
} Out;

/* The object's storage resized to ``cap`` bytes of segment (and the head before them). */
static int
resize_out(Out *o, Py_ssize_t cap)
{
    if (o->is_bytes) {
        /* (Ours alone, never shared until returned: resizing it in place is allowed.) */
        if (_PyBytes_Resize(&o->array, o->head + cap) < 0)
            return -1; /* (the object is freed and ``array`` NULL) */
        o->buf = (uint8_t *)PyBytes_AS_STRING(o->array) + o->head;
    }
    else {
        if (PyByteArray_Resize(o->array, cap) < 0)
            return -1;
        o->buf = (uint8_t *)PyByteArray_AS_STRING(o->array);
    }
    o->cap = cap;
    return 0;
}

static int
reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap * 2;
    if (cap < o->len + more)
        cap = o->len + more;
    return resize_out(o, cap);
}

/* ``bytes`` zeroed bytes at the end; their first byte's offset, or -1 (an exception). */
static Py_ssize_t
append_zeros(Out *o, Py_ssize_t bytes)
{
    if (reserve(o, bytes) < 0)
        return -1;
    Py_ssize_t at = o->len;
    memset(o->buf + at, 0, (size_t)bytes);
    o->len += bytes;
    return at;
}

static inline void
store_bits(Out *o, Py_ssize_t at, uint64_t value, int width)
{
    uint8_t *p = o->buf + at;
    switch (width) {
    case 1: p[0] = (uint8_t)value; break;
    case 2: { uint16_t v = (uint16_t)value; memcpy(p, &v, 2); break; }
    case 4: { uint32_t v = (uint32_t)value; memcpy(p, &v, 4); break; }
    default: memcpy(p, &value, 8); break;
    }
}

/* The pointer word at word ``at``: its two halves. */
static inline void
patch_word(Out *o, Py_ssize_t at, uint32_t lower, uint32_t upper)
{
    uint64_t word = (uint64_t)lower | (uint64_t)upper << 32;
    memcpy(o->buf + (at << 3), &word, 8);
}

/* A pointer's offset field from word ``at`` to word ``target``; -1 past 30 bits. */
static inline int
offset_bits(Py_ssize_t at, Py_ssize_t target, uint32_t *out)
{
    Py_ssize_t offset = target - at - 1;
    if (offset < -(1 << 29) || offset >= (1 << 29))
        return -1;
    *out = (uint32_t)((uint64_t)offset << 2) & 0xFFFFFFFCu;
    return 0;
}

static int
out_bail(Out *o)
{
    o->bailed = 1;
    return -1;
}

/* Whether a field of plan kind ``kind`` may hold a pointer (rows._NO_POINTER's others). */
static inline int
may_hold_pointer(int kind)
{
    return kind != K_VOID && kind != K_BOOL && kind != K_INT && kind != K_FLOAT
           && kind != K_ENUM;
}

/* A struct's values as the encoder walks them (a new reference): a row as it is, or a
 * dict of fields (by either of their names, as capsvc.codec.values takes them) as a list
 * in schema order with ``missing`` where a field is not given; NULL to bail (anything
 * else, a key that names no field, or a field given by both names) or on an error. */
static PyObject *
as_values(Out *o, Program *p, PyObject *value, int *is_row)
{
    if (PyTuple_CheckExact(value)) {
        if (!p->ready || PyTuple_GET_SIZE(value) != p->width) {
            out_bail(o);
            return NULL;
        }
        *is_row = 1;
        return Py_NewRef(value);
    }
    if (!PyDict_CheckExact(value) || !p->ready) {
        out_bail(o);
        return NULL;
    }
    PyObject *list = PyList_New(p->count);
    if (list == NULL)
        return NULL;
    Py_ssize_t used = 0;
    for (Py_ssize_t index = 0; index < p->count; index++) {
        Field *f = &p->fields[index];
        PyObject *item = PyDict_GetItemWithError(value, f->key);
        if (item == NULL && !PyErr_Occurred() && f->name != f->key)
            item = PyDict_GetItemWithError(value, f->name);
        if (item == NULL && PyErr_Occurred()) {
            Py_DECREF(list);
            return NULL;
        }
        if (item != NULL)
            used++;
        PyList_SET_ITEM(list, index, Py_NewRef(item != NULL ? item : o->missing));
    }
    if (used != PyDict_GET_SIZE(value)) {
        Py_DECREF(list);
        out_bail(o); /* Python names the key, or the field given twice */
        return NULL;
    }
    *is_row = 0;
    return list;
}

static int is_pointer_kind(int kind)
{
    return kind == K_TEXT || kind == K_DATA || kind == K_STRUCT || kind == K_LIST
           || kind == 10 /* CAPABILITY */ || kind == 11 /* ANY */;
}

/* An int (or an int subclass's instance: an IntEnum member, a bool) of at most one digit:
 * its value in ``*out``, 1; else 0 (anything else, to convert by the API). CPython 3.11's
 * layout (the sign and digit count in ``ob_size``, 30-bit digits), which a subclass's
 * instance shares: most numbers and every enum member are such ints, and the call into
 * the API cost more than the rest of their encoding. */
static inline int
small_int(PyObject *value, long long *out)
{
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
    if (PyLong_Check(value)) {
        Py_ssize_t size = Py_SIZE(value);
        if (size >= -1 && size <= 1) {
            *out = (long long)size * (long long)((PyLongObject *)value)->ob_digit[0];
            return 1;
        }
    }
#endif
    (void)value;
    (void)out;
    return 0;
}

/* Whether ``number`` fits ``f``'s width (under 8 bytes) and sign. */
static inline int
fits_width(long long number, Field *f)
{
    int bits = f->width * 8;
    long long low = f->is_signed ? -(1LL << (bits - 1)) : 0;
    long long high = f->is_signed ? (1LL << (bits - 1)) - 1 : (1LL << bits) - 1;
    return number >= low && number <= high;
}

/* An integer of ``f``'s width and sign, as the bits stored (before the XOR); -1 to bail. */
static int
integer_bits(PyObject *value, Field *f, uint64_t *out)
{
    long long small;
    if (f->width < 8 && small_int(value, &small)) {
        if (!fits_width(small, f))
            return -1;
        *out = (uint64_t)small;
        return 0;
    }
    if (!PyLong_Check(value))
        return -1;
    if (f->width == 8 && !f->is_signed) {
        unsigned long long number = PyLong_AsUnsignedLongLong(value);
        if (number == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        *out = number;
        return 0;
    }
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (f->width < 8 && !fits_width(number, f))
        return -1;
    *out = (uint64_t)number;
    return 0;
}

static int encode_struct_at(Out *o, Program *p, PyObject *row, Py_ssize_t at);
static int fill_data(Out *o, Program *p, PyObject *values, int is_row, Py_ssize_t base,
                     Py_ssize_t data);
static int fill_pointers(Out *o, Program *p, PyObject *values, int is_row, Py_ssize_t base,
                         Py_ssize_t ptr);

/* One of the encoder's two phases over a struct's values (``fill_data``: ``at`` is the data
 * section's byte; ``fill_pointers``: the pointer section's word). */
typedef int (*Phase)(Out *o, Program *p, PyObject *values, int is_row, Py_ssize_t base,
                     Py_ssize_t at);

/* ``phase`` over the group field ``f`` given as ``value`` (a row of the group's own, or a
 * dict of its fields). */
static int
fill_group(Out *o, Field *f, PyObject *value, Phase phase, Py_ssize_t at)
{
    int group_is_row;
    PyObject *group = as_values(o, (Program *)f->sub, value, &group_is_row);
    if (group == NULL)
        return -1;
    int rc = phase(o, (Program *)f->sub, group, group_is_row, 0, at);
    Py_DECREF(group);
    return rc;
}

/* One field's value (given: not missing, not None in a row) in the data section at byte
 * ``data``: numbers, bools, enums, Void, a group that is a union member (its discriminant
 * is the caller's); pointers wait for phase two. ``is_row``: ``value`` came from a row.
 * Inlined in both loops of ``fill_data``: a call per field costs carsales' 1,800 fields a
 * request ~10 %. */
static inline __attribute__((always_inline)) int
data_field(Out *o, Field *f, PyObject *value, int is_row, Py_ssize_t data)
{
    if (f->kind == K_VIA) {
        if (value == Py_None && is_pointer_kind(f->orig_kind))
            return 0; /* a null pointer, as Python writes it */
        return out_bail(o);
    }
    switch (f->kind) {
    case K_INT: {
        uint64_t bits;
        if (integer_bits(value, f, &bits) < 0)
            return out_bail(o);
        store_bits(o, data + f->offset, bits ^ f->xor_bits, f->width);
        break;
    }
    case K_BOOL: {
        if (value != Py_True && value != Py_False)
            return out_bail(o);
        if ((value == Py_True) ^ (int)f->xor_bits)
            o->buf[data + (f->offset >> 3)] |= (uint8_t)(1u << (f->offset & 7));
        break;
    }
    case K_FLOAT: {
        double number;
        if (PyFloat_CheckExact(value))
            number = PyFloat_AS_DOUBLE(value);
        else
            return out_bail(o); /* ints and float subclasses: Python converts them */
        if (f->width == 4) {
            if (number - number == 0.0 && (number > 3.4028234663852886e38
                                           || number < -3.4028234663852886e38))
                return out_bail(o);
            float single = (float)number;
            memcpy(o->buf + data + f->offset, &single, 4);
        }
        else {
            memcpy(o->buf + data + f->offset, &number, 8);
        }
        break;
    }
    case K_ENUM: {
        if (!PyLong_Check(value) || PyBool_Check(value))
            return out_bail(o);
        long long code;
        if (!small_int(value, &code)) {
            code = PyLong_AsLongLong(value);
            if (code == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return out_bail(o);
            }
        }
        if (code < 0 || code > 0xFFFF)
            return out_bail(o);
        store_bits(o, data + f->offset, ((uint64_t)code ^ f->xor_bits) & 0xFFFF, 2);
        break;
    }
    case K_VOID:
        if (value != Py_True && (is_row || value != Py_None))
            return out_bail(o);
        break;
    case K_GROUP:
        return fill_group(o, f, value, fill_data, data);
    default: /* pointers: phase two */
        break;
    }
    return 0;
}

/* Phase one: the data section of a struct of ``p`` at byte ``data`` (zeroed): numbers,
 * bools, enums, discriminants, and the same for its groups. ``values``: a row (its
 * values from item ``base`` on), walked along ``p->flat``, or a list in schema order. */
static int
fill_data(Out *o, Program *p, PyObject *values, int is_row, Py_ssize_t base, Py_ssize_t data)
{
    if (!p->ready || (is_row && base + p->width > PyTuple_GET_SIZE(values)))
        return out_bail(o);
    if (is_row) {
        /* The discriminants written so far (one union member each: a second is Python's
         * to name). A struct's unions are its own and its groups'; more than this many
         * set at once is left to Python too. */
        Py_ssize_t unions[8];
        int union_count = 0;
        for (Py_ssize_t index = 0; index < p->flat_count; index++) {
            Field *f = &p->flat[index];
            PyObject *value = PyTuple_GET_ITEM(values, base + f->row_at);
            if (value == o->missing || value == Py_None)
                continue; /* left at its default */
            if (f->disc >= 0) { /* (a VIA field given bails below: its disc goes too) */
                for (int u = 0; u < union_count; u++)
                    if (unions[u] == f->disc_at)
                        return out_bail(o);
                if (union_count == (int)(sizeof unions / sizeof unions[0]))
                    return out_bail(o);
                unions[union_count++] = f->disc_at;
                store_bits(o, data + f->disc_at, (uint64_t)f->disc, 2);
            }
            if (data_field(o, f, value, 1, data) < 0)
                return -1;
        }
        return 0;
    }
    int members = 0;
    for (Py_ssize_t index = 0; index < p->count; index++) {
        Field *f = &p->fields[index];
        PyObject *value = PyList_GET_ITEM(values, index); /* (schema order) */
        if (value == o->missing)
            continue;
        if (f->disc >= 0) { /* a VIA member too: given None, it is set with a null pointer */
            if (members++)
                return out_bail(o); /* two union members: Python names them */
            store_bits(o, data + p->disc_at, (uint64_t)f->disc, 2);
        }
        if (data_field(o, f, value, 0, data) < 0)
            return -1;
    }
    return 0;
}

static int
encode_bytes(Out *o, Py_ssize_t at, const char *bytes, Py_ssize_t size, int is_text)
{
    Py_ssize_t total = size + is_text; /* Text ends in a NUL */
    Py_ssize_t padded = (total + 7) & ~(Py_ssize_t)7;
    if (total >= (1 << 29))
        return out_bail(o);
    uint32_t lower;
    if (offset_bits(at, o->len >> 3, &lower) < 0)
        return out_bail(o);
    Py_ssize_t start = append_zeros(o, padded);
    if (start < 0)
        return -1;
    memcpy(o->buf + start, bytes, (size_t)size);
    patch_word(o, at, lower | 1, (uint32_t)total << 3 | 2);
    return 0;
}

static int encode_elements(Out *o, Program *element, PyObject *items, Py_ssize_t at);

/* A list of structs: its elements held in a tuple of their own while they are encoded (a
 * dict key's ``__eq__`` may run Python code, which could change the user's list). */
static int
encode_composite(Out *o, Program *element, PyObject *list, Py_ssize_t at)
{
    PyObject *items = PySequence_Tuple(list);
    if (items == NULL)
        return -1;
    int rc = encode_elements(o, element, items, at);
    Py_DECREF(items);
    return rc;
}

static int
encode_elements(Out *o, Program *element, PyObject *items, Py_ssize_t at)
{
    Py_ssize_t count = PyTuple_GET_SIZE(items);
    PyObject **item = ((PyTupleObject *)items)->ob_item;
    Py_ssize_t dw = element->data_words, pc = element->pointers, size = dw + pc;
    if (count >= (1 << 29) || count * size >= (1 << 29))
        return out_bail(o);
    uint32_t lower;
    Py_ssize_t tag = o->len >> 3;
    if (offset_bits(at, tag, &lower) < 0)
        return out_bail(o);
    if (append_zeros(o, (1 + count * size) << 3) < 0)
        return -1;
    patch_word(o, at, lower | 1, (uint32_t)(count * size) << 3 | 7);
    patch_word(o, tag, (uint32_t)count << 2, (uint32_t)(dw | pc << 16));
    Py_ssize_t first = tag + 1;
    /* Every element's sections first, then every element's pointer targets. A row is
     * used as it is; a dict is made a list of values once, kept in ``converted`` (made
     * only when a dict comes) from one pass to the other. */
    PyObject *converted = NULL;
    int rc = 0;
    for (Py_ssize_t index = 0; rc == 0 && index < count; index++) {
        PyObject *value = item[index];
        Py_ssize_t data = (first + index * size) << 3;
        if (PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == element->width) {
            rc = fill_data(o, element, value, 1, 0, data);
            continue;
        }
        int is_row;
        PyObject *values = as_values(o, element, value, &is_row);
        if (values == NULL) {
            rc = -1; /* a reader, or anything else: Python's */
            break;
        }
        if (converted == NULL && (converted = PyList_New(count)) == NULL) {
            Py_DECREF(values);
            rc = -1;
            break;
        }
        PyList_SET_ITEM(converted, index, values);
        rc = fill_data(o, element, values, is_row, 0, data);
    }
    for (Py_ssize_t index = 0; rc == 0 && index < count; index++) {
        PyObject *values = converted ? PyList_GET_ITEM(converted, index) : NULL;
        if (values == NULL)
            values = item[index];
        rc = fill_pointers(o, element, values, PyTuple_CheckExact(values), 0,
                           first + index * size + dw);
    }
    Py_XDECREF(converted);
    return rc;
}

/* One field's value (given, not None) at pointer word ``at`` (``ptr``: its struct's
 * pointer section, for a group that is a union member). */
static inline __attribute__((always_inline)) int
pointer_field(Out *o, Field *f, PyObject *value, Py_ssize_t at, Py_ssize_t ptr)
{
    switch (f->kind) {
    case K_TEXT: {
        if (!PyUnicode_Check(value))
            return out_bail(o);
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(value, &size);
        if (utf8 == NULL) {
            PyErr_Clear(); /* surrogates: Python's encoder names the fault */
            return out_bail(o);
        }
        return encode_bytes(o, at, utf8, size, 1);
    }
    case K_DATA:
        if (PyBytes_CheckExact(value))
            return encode_bytes(o, at, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), 0);
        if (PyByteArray_CheckExact(value))
            return encode_bytes(o, at, PyByteArray_AS_STRING(value),
                                PyByteArray_GET_SIZE(value), 0);
        return out_bail(o);
    case K_STRUCT:
        return encode_struct_at(o, (Program *)f->sub, value, at);
    case K_LIST:
        if (!PyList_CheckExact(value) && !PyTuple_CheckExact(value))
            return out_bail(o);
        return encode_composite(o, (Program *)f->sub, value, at);
    case K_GROUP:
        return fill_group(o, f, value, fill_pointers, ptr);
    default:
        return 0;
    }
}

/* Phase two: the pointer targets of a struct of ``p`` whose pointer section starts at
 * word ``ptr``, appended in the Python encoder's order (``pointer_order``; for a row,
 * ``flat_pointers``: the same with each spliced group's in its place). */
static int
fill_pointers(Out *o, Program *p, PyObject *values, int is_row, Py_ssize_t base,
              Py_ssize_t ptr)
{
    if (is_row) {
        for (Py_ssize_t n = 0; n < p->flat_pointer_count; n++) {
            Field *f = &p->flat[p->flat_pointers[n]];
            PyObject *value = PyTuple_GET_ITEM(values, base + f->row_at);
            if (value == o->missing || value == Py_None)
                continue; /* left at its default */
            if (pointer_field(o, f, value, ptr + f->offset, ptr) < 0)
                return -1;
        }
        return 0;
    }
    for (Py_ssize_t n = 0; n < p->pointer_count; n++) {
        Py_ssize_t index = p->pointer_order[n];
        Field *f = &p->fields[index];
        PyObject *value = PyList_GET_ITEM(values, index);
        if (value == o->missing || value == Py_None)
            continue;
        if (pointer_field(o, f, value, ptr + f->offset, ptr) < 0)
            return -1;
    }
    return 0;
}

/* A struct of ``p`` holding ``value`` (a row or a dict), appended, with the pointer at
 * word ``at`` to it. */
static int
encode_struct_at(Out *o, Program *p, PyObject *value, Py_ssize_t at)
{
    int is_row;
    PyObject *values = as_values(o, p, value, &is_row);
    if (values == NULL)
        return -1;
    int rc = -1;
    uint32_t lower;
    Py_ssize_t start = o->len >> 3;
    if (offset_bits(at, start, &lower) < 0) {
        out_bail(o);
        goto done;
    }
    if (p->data_words == 0 && p->pointers == 0)
        lower = 0xFFFFFFFCu; /* offset -1: C++'s pointer to a struct of no words, not null */
    if (append_zeros(o, (p->data_words + p->pointers) << 3) < 0)
        goto done;
    patch_word(o, at, lower, (uint32_t)(p->data_words | p->pointers << 16));
    if (Py_EnterRecursiveCall(" encoding a struct"))
        goto done;
    rc = fill_data(o, p, values, is_row, 0, start << 3);
    if (rc == 0)
        rc = fill_pointers(o, p, values, is_row, 0, start + p->data_words);
    Py_LeaveRecursiveCall();
done:
    Py_DECREF(values);
    return rc;
}

/* The message of a root of ``args[0]`` holding ``args[1]`` (see above); ``framed``: as a
 * bytes object in the standard stream framing (one segment: its table is one word, the
 * count less one and the size in words), written in place so that nothing is copied;
 * else the bare segment, a bytearray. */
static PyObject *
encode_message(PyObject *const *args, Py_ssize_t nargs, int framed, const char *usage)
{
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &ProgramType)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Program *p = (Program *)args[0];
    Out o = {0};
    o.missing = args[2];
    int is_row = 0;
    PyObject *values;
    if (PyList_CheckExact(args[1])) { /* the root's values as generated new_message passes them */
        if (!p->ready || PyList_GET_SIZE(args[1]) != p->count)
            Py_RETURN_NONE;
        values = Py_NewRef(args[1]);
    }
    else {
        values = as_values(&o, p, args[1], &is_row);
        if (values == NULL) {
            if (PyErr_Occurred())
                return NULL;
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t words = 1 + p->data_words + p->pointers;
    /* The last message's size (and a little more), once there was one: a root of fixed
     * size then needs no resizing at all; the first message starts at 256 bytes. */
    o.cap = p->size_hint > 0 ? p->size_hint : 256;
    if (o.cap < words << 3)
        o.cap = words << 3;
    o.is_bytes = framed;
    o.head = framed ? 8 : 0;
    if (framed)
        o.array = PyBytes_FromStringAndSize(NULL, o.head + o.cap);
    else
        o.array = PyByteArray_FromStringAndSize(NULL, o.cap);
    if (o.array == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    o.buf = (uint8_t *)(framed ? PyBytes_AS_STRING(o.array) : PyByteArray_AS_STRING(o.array))
            + o.head;
    memset(o.buf, 0, (size_t)(words << 3));
    o.len = words << 3;
    patch_word(&o, 0, 0, (uint32_t)(p->data_words | p->pointers << 16));
    int rc = fill_data(&o, p, values, is_row, 0, 8);
    if (rc == 0)
        rc = fill_pointers(&o, p, values, is_row, 0, 1 + p->data_words);
    Py_DECREF(values);
    if (rc == 0 && framed && (o.len >> 3) > 0xFFFFFFFFll)
        rc = out_bail(&o); /* a segment's size is 32 bits: Python names the fault */
    if (rc < 0) {
        Py_XDECREF(o.array);
        if (o.bailed && !PyErr_Occurred())
            Py_RETURN_NONE;
        return NULL;
    }
    p->size_hint = o.len + (o.len >> 3);
    if (resize_out(&o, o.len) < 0) {
        Py_XDECREF(o.array);
        return NULL;
    }
    if (framed) {
        uint64_t table = (uint64_t)(o.len >> 3) << 32; /* segments - 1 = 0, then the size */
        memcpy(PyBytes_AS_STRING(o.array), &table, 8);
    }
    return o.array;
}

static PyObject *
py_encode_root(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return encode_message(args, nargs, 0, "encode_root(program, values, missing)");
}

static PyObject *
py_encode_framed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return encode_message(args, nargs, 1, "encode_framed(program, values, missing)");
}

/* ---------------------------------------------------------------- packing
 *
 * ``pack(data)`` and ``unpack(data, max_words)``: capsvc.codec.packing's word-at-a-time
 * loops in C, the same bytes out (libcapnp's choices: a zero word's run counts the zero
 * words after it, an 0xff word's the words after it with at most one zero byte, up to
 * 255 each). ``unpack`` returns None for a stream it cannot decode (truncated, or more
 * than ``max_words`` words): packing.py then decodes it in Python to name the fault. */

/* The bits set in each byte value (a table: a generic x86-64 build has no popcount
 * instruction, and the builtin becomes a libgcc call). Filled at import. */
static uint8_t bits_set[256];

static void
fill_bits_set(void)
{
    for (unsigned value = 0; value < 256; value++) {
        unsigned count = 0;
        for (unsigned bit = 0; bit < 8; bit++)
            count += value >> bit & 1;
        bits_set[value] = (uint8_t)count;
    }
}

static inline unsigned
word_tag(uint64_t word)
{
    /* Fold each byte onto its bit 0, then gather the eight bits into the top byte. */
    uint64_t bits = word | (word >> 4);
    bits |= bits >> 2;
    bits |= bits >> 1;
    bits &= 0x0101010101010101ull;
    return (unsigned)((bits * 0x0102040810204080ull) >> 56);
}

/* For each tag and byte: how many of the word's bytes before it are stored (set in the
 * tag); filled at import. */
static uint8_t stored_before[256][8];

static void
fill_stored_before(void)
{
    for (unsigned tag = 0; tag < 256; tag++)
        for (unsigned byte = 0; byte < 8; byte++)
            stored_before[tag][byte] = bits_set[tag & ((1u << byte) - 1)];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* Ordinary words decoded with one byte shuffle each (SSSE3's pshufb, on every x86-64 CPU
 * since 2011 and most before; checked at import, the plain loop otherwise): the shuffle
 * puts stored byte ``stored_before[tag][b]`` at byte ``b`` and zero where the tag says. */
#include <tmmintrin.h>
#define HAVE_SHUFFLE 1
static uint8_t expand_mask[256][16] __attribute__((aligned(16)));
/* Packing the other way: lane ``j`` takes the word's ``j``-th non-zero byte. */
static uint8_t compact_mask[256][16] __attribute__((aligned(16)));
static int shuffle_ok;

static void
fill_shuffle_masks(void)
{
    for (unsigned tag = 0; tag < 256; tag++) {
        unsigned kept = 0;
        for (unsigned byte = 0; byte < 16; byte++) {
            int set = byte < 8 && (tag >> byte & 1);
            expand_mask[tag][byte] = set ? stored_before[tag][byte] : 0x80; /* 0x80: zero */
            compact_mask[tag][byte] = 0x80;
            if (set)
                compact_mask[tag][kept++] = (uint8_t)byte;
        }
    }
    __builtin_cpu_init();
    shuffle_ok = __builtin_cpu_supports("ssse3");
}

/* Pack the ordinary words from ``*index`` on (not zero, not all eight bytes set) into
 * ``out`` at ``pos``; stop at any other: the new position. Each word's bytes are stored
 * 8 at a time (the ones past its kept bytes are overwritten next: ``pack_words`` leaves
 * room for 10 bytes a word). */
__attribute__((target("ssse3"))) static Py_ssize_t
pack_ordinary(const uint8_t *in, Py_ssize_t *index, Py_ssize_t words, uint8_t *out,
              Py_ssize_t pos)
{
    Py_ssize_t at = *index;
    while (at < words) {
        uint64_t word = load64(in + (at << 3));
        unsigned tag = word_tag(word);
        if (tag == 0 || tag == 0xFF)
            break;
        out[pos] = (uint8_t)tag;
        __m128i bytes = _mm_cvtsi64_si128((long long)word);
        __m128i mask = _mm_load_si128((const __m128i *)compact_mask[tag]);
        _mm_storel_epi64((__m128i *)(out + pos + 1), _mm_shuffle_epi8(bytes, mask));
        pos += 1 + bits_set[tag];
        at++;
    }
    *index = at;
    return pos;
}

/* Decode the ordinary words from ``pos`` on into ``*out`` while 16 bytes can be read after
 * a tag and a word fits before ``out_end``; stop at a zero or 0xff tag (or near either
 * end): the next tag's position. */
__attribute__((target("ssse3"))) static Py_ssize_t
unpack_ordinary(const uint8_t *in, Py_ssize_t pos, Py_ssize_t end, uint8_t **out,
                const uint8_t *out_end)
{
    uint8_t *to = *out;
    while (pos + 17 <= end && out_end - to >= 8) {
        unsigned tag = in[pos];
        if (tag == 0 || tag == 0xFF)
            break;
        __m128i stored = _mm_loadu_si128((const __m128i *)(in + pos + 1));
        __m128i mask = _mm_load_si128((const __m128i *)expand_mask[tag]);
        _mm_storel_epi64((__m128i *)to, _mm_shuffle_epi8(stored, mask));
        to += 8;
        pos += 1 + bits_set[tag];
    }
    *out = to;
    return pos;
}
#endif

/* Whether ``word`` has at most one zero byte: the high bit of each byte of ``zeros`` is
 * set exactly where the byte is zero (no carries cross bytes: each byte's low seven bits
 * plus 0x7F stays below 0x100). */
static inline int
few_zero_bytes(uint64_t word)
{
    uint64_t low = 0x7F7F7F7F7F7F7F7Full;
    uint64_t zeros = ~(((word & low) + low) | word | low);
    return (zeros & (zeros - 1)) == 0;
}

/* Append the packed encoding of ``words`` words at ``in`` to ``out`` (room for 10 bytes a
 * word); the bytes written. */
static Py_ssize_t
pack_words(const uint8_t *in, Py_ssize_t words, uint8_t *out)
{
    Py_ssize_t pos = 0, index = 0;
    while (index < words) {
#ifdef HAVE_SHUFFLE
        if (shuffle_ok) {
            pos = pack_ordinary(in, &index, words, out, pos);
            if (index >= words)
                break;
        }
#endif
        uint64_t word = load64(in + (index << 3));
        index++;
        if (word == 0) {
            unsigned run = 0;
            while (run < 255 && index < words && load64(in + (index << 3)) == 0) {
                run++;
                index++;
            }
            out[pos++] = 0;
            out[pos++] = (uint8_t)run;
            continue;
        }
        unsigned tag = word_tag(word);
        out[pos++] = (uint8_t)tag;
        if (tag != 0xFF) {
            for (int byte = 0; byte < 8; byte++) {
                out[pos] = (uint8_t)(word >> (byte * 8));
                pos += tag >> byte & 1; /* kept only where the byte is not zero */
            }
            continue;
        }
        memcpy(out + pos, &word, 8);
        pos += 8;
        Py_ssize_t count_at = pos++;
        Py_ssize_t first = index;
        while (index < words && index - first < 255 && few_zero_bytes(load64(in + (index << 3))))
            index++; /* at most one zero byte: raw (two or more: packing pays again) */
        memcpy(out + pos, in + (first << 3), (size_t)(index - first) << 3);
        pos += (index - first) << 3;
        out[count_at] = (uint8_t)(index - first);
    }
    return pos;
}

/* The buffer messages up to PACK_SCRATCH_MAX bytes (packed, worst case) are packed in
 * before being copied out at their size; kept for the process (at most that much), and
 * used with the GIL held and no Python code run meanwhile. */
#define PACK_SCRATCH_MAX ((Py_ssize_t)1 << 20)
static uint8_t *scratch_buf;
static Py_ssize_t scratch_cap;

static uint8_t *
pack_scratch(Py_ssize_t size)
{
    if (size > scratch_cap) {
        uint8_t *grown = PyMem_Realloc(scratch_buf, (size_t)size);
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        scratch_buf = grown;
        scratch_cap = size;
    }
    return scratch_buf;
}

/* The packed encoding of ``table`` (one word, or NULL for none) and then ``words`` words
 * from ``in``, as a new bytes. Up to PACK_SCRATCH_MAX bytes of worst-case output it is
 * packed into the scratch buffer and copied out at its size: a worst-case bytes, a
 * quarter larger than the message and cut down after, lands above glibc's mmap threshold
 * once messages are a few hundred KiB, and every page of it faults again on every call (a
 * 200 KiB catrank request packed in 105 us that way; in ~27 us with the copy). */
static PyObject *
packed_bytes(const uint64_t *table, const uint8_t *in, Py_ssize_t words)
{
    /* At most 10 bytes a word (an 0xff word and its count), and 2 for a zero run; one
     * spare byte: an ordinary word's last byte is stored before it is known to count. */
    Py_ssize_t worst = (words + (table != NULL)) * 10 + 3;
    PyObject *result = NULL;
    uint8_t *out;
    if (worst <= PACK_SCRATCH_MAX)
        out = pack_scratch(worst);
    else if ((result = PyBytes_FromStringAndSize(NULL, worst)) != NULL)
        out = (uint8_t *)PyBytes_AS_STRING(result);
    else
        out = NULL;
    if (out == NULL)
        return NULL;
    Py_ssize_t written = table != NULL ? pack_words((const uint8_t *)table, 1, out) : 0;
    written += pack_words(in, words, out + written);
    if (result == NULL)
        return PyBytes_FromStringAndSize((const char *)out, written);
    if (_PyBytes_Resize(&result, written) < 0)
        return NULL;
    return result;
}

static PyObject *
py_pack(PyObject *self, PyObject *data)
{
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "pack() takes bytes");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    if (size & 7) {
        PyErr_SetString(PyExc_ValueError, "packing needs whole words");
        return NULL;
    }
    return packed_bytes(NULL, (const uint8_t *)PyBytes_AS_STRING(data), size >> 3);
}

/* ``pack_framed(segment)``: the packed encoding of a one-segment message in the stream
 * framing, ``pack(encode_message([segment]))`` without the framed copy. The segment table
 * word (segment count 1, then the size) is never part of a run: its low half is zero and
 * its high half is not, unless the segment is empty. */
static PyObject *
py_pack_framed(PyObject *self, PyObject *segment)
{
    Py_buffer view;
    if (PyObject_GetBuffer(segment, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t words = view.len >> 3;
    PyObject *result = NULL;
    if ((view.len & 7) || words > 0xFFFFFFFFll)
        PyErr_SetString(PyExc_ValueError, "a segment is a whole number of words (< 2**32)");
    else {
        uint64_t table = (uint64_t)words << 32;
        result = packed_bytes(&table, (const uint8_t *)view.buf, words);
    }
    PyBuffer_Release(&view);
    return result;
}

/* The words ``packed`` encodes, or -1 if it cannot be decoded within ``limit`` words. */
static long long
unpacked_words(const uint8_t *in, Py_ssize_t end, long long limit)
{
    Py_ssize_t pos = 0;
    long long words = 0;
    while (pos < end) {
        unsigned tag = in[pos++];
        if (tag == 0) {
            if (pos >= end)
                return -1;
            words += (long long)in[pos++] + 1;
        }
        else if (tag == 0xFF) {
            if (pos + 9 > end)
                return -1;
            unsigned count = in[pos + 8];
            if (pos + 9 + ((Py_ssize_t)count << 3) > end)
                return -1;
            words += (long long)count + 1;
            pos += 9 + ((Py_ssize_t)count << 3);
        }
        else {
            words += 1;
            pos += bits_set[tag];
            if (pos > end)
                return -1;
        }
        if (words > limit)
            return -1;
    }
    return words;
}



/* The word an ordinary tag (neither 0 nor 0xff) and its stored bytes at ``at`` encode.
 * Branch-free, every byte's load independent of the others: byte ``b`` is stored byte
 * ``stored_before[tag][b]``. Where the tag says zero the load still happens, at most at
 * the end of the stored bytes (a bytes object's own trailing NUL past the end, for the
 * last word of a packed stream), and the byte is masked to zero. */
static inline uint64_t
ordinary_word(const uint8_t *at, unsigned tag)
{
    const uint8_t *before = stored_before[tag];
    uint64_t value = 0;
    for (int byte = 0; byte < 8; byte++)
        value |= (uint64_t)(at[before[byte]] & (0u - (tag >> byte & 1))) << (byte * 8);
    return value;
}

/* Decode ``in[pos:end]`` into exactly ``out[0:size]``, checking every read and write: 0
 * when the stream fills the output exactly, -1 for anything else (truncated, too long,
 * too short). */
static int
unpack_exact(const uint8_t *in, Py_ssize_t pos, Py_ssize_t end, uint8_t *out, size_t size)
{
    const uint8_t *out_end = out + size;
    while (pos < end) {
#ifdef HAVE_SHUFFLE
        if (shuffle_ok) {
            pos = unpack_ordinary(in, pos, end, &out, out_end);
            if (pos >= end)
                break;
        }
#endif
        unsigned tag = in[pos++];
        if (tag == 0) {
            if (pos >= end)
                return -1;
            size_t zeros = ((size_t)in[pos++] + 1) << 3;
            if ((size_t)(out_end - out) < zeros)
                return -1;
            memset(out, 0, zeros);
            out += zeros;
        }
        else if (tag == 0xFF) {
            if (end - pos < 9)
                return -1;
            size_t raw = (size_t)in[pos + 8] << 3;
            if ((size_t)(end - pos - 9) < raw || (size_t)(out_end - out) < 8 + raw)
                return -1;
            memcpy(out, in + pos, 8);
            memcpy(out + 8, in + pos + 9, raw);
            out += 8 + raw;
            pos += 9 + (Py_ssize_t)raw;
        }
        else {
            if (end - pos < bits_set[tag] || out_end - out < 8)
                return -1;
            uint64_t value = ordinary_word(in + pos, tag);
            memcpy(out, &value, 8);
            out += 8;
            pos += bits_set[tag];
        }
    }
    return out == out_end ? 0 : -1;
}

/* The arguments of ``unpack`` and ``unpack_segment``: ``(data: bytes, max_words: int)``;
 * -1 with the exception set. A limit too large for a machine word never binds. */
static int
unpack_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, const uint8_t **in,
            Py_ssize_t *end, long long *limit)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *limit = PyLong_AsLongLong(args[1]);
    if (*limit == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        *limit = LLONG_MAX;
    }
    *in = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    *end = PyBytes_GET_SIZE(args[0]);
    return 0;
}

/* ``in[pos:end]`` decoded into a new bytes of exactly ``words`` words, or None where the
 * stream does not fill it exactly (Python then names the fault). */
static PyObject *
unpacked_bytes(const uint8_t *in, Py_ssize_t pos, Py_ssize_t end, long long words)
{
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(words << 3));
    if (result == NULL)
        return NULL;
    if (unpack_exact(in, pos, end, (uint8_t *)PyBytes_AS_STRING(result), (size_t)words << 3) < 0) {
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    return result;
}

static PyObject *
py_unpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const uint8_t *in;
    Py_ssize_t end;
    long long limit;
    if (unpack_args(args, nargs, "unpack(data: bytes, max_words: int)", &in, &end, &limit) < 0)
        return NULL;
    long long words = unpacked_words(in, end, limit);
    if (words < 0)
        Py_RETURN_NONE; /* Python names the fault */
    return unpacked_bytes(in, 0, end, words);
}

/* ``unpack_segment(data, max_words)``: the one segment of a packed message in the stream
 * framing, ``unframe(unpack(data))[0]`` without the unpacked copy; None for anything
 * else (several segments, a table that disagrees with the size, a fault), which Python
 * then reads or names the fault of.
 *
 * One pass: the segment table is the first word, packed on its own (its first four
 * bytes, the segment count less one, are zero: neither a zero nor a raw tag) and it says
 * how long the segment is, so the output is made that size first and decoded into with
 * every read and write checked. (An empty segment's table is a zero word: a zero run of
 * one.) */
static PyObject *
py_unpack_segment(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    const uint8_t *in;
    Py_ssize_t end;
    long long limit;
    if (unpack_args(args, nargs, "unpack_segment(data: bytes, max_words: int)", &in, &end,
                    &limit) < 0)
        return NULL;
    if (end < 1)
        Py_RETURN_NONE;
    unsigned tag = in[0];
    if (tag == 0) { /* a zero table word: an empty segment, and nothing may follow it */
        if (end == 2 && in[1] == 0 && limit >= 1)
            return PyBytes_FromStringAndSize(NULL, 0);
        Py_RETURN_NONE;
    }
    if ((tag & 0x0F) != 0 || 1 + bits_set[tag] > end)
        Py_RETURN_NONE; /* several segments, or truncated: the general way's */
    long long words = (long long)(ordinary_word(in + 1, tag) >> 32);
    if (words + 1 > limit) /* the table's word counts, as ``unpack``'s limit counts it */
        Py_RETURN_NONE;
    return unpacked_bytes(in, 1 + bits_set[tag], end, words);
}

/* ---------------------------------------------------------------- framing
 *
 * ``one_segment(buf, pos, max_words)``: the body of the one-segment message whose
 * stream framing (rpc-protocol.md §1) starts at byte ``pos`` of ``buf`` (a bytearray or bytes),
 * as a new ``bytes`` (its storage 16-byte aligned, as every segment must be 8), when all
 * of it is there and its size is within ``max_words``. None otherwise (a segment table
 * of more segments, a message not complete yet, one over the limit): capsvc.framing's
 * FrameDecoder then does the general work and names the fault. */
static PyObject *
py_one_segment(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int is_bytes = nargs == 3 && PyBytes_CheckExact(args[0]);
    if (nargs != 3 || !(is_bytes || PyByteArray_CheckExact(args[0]))) {
        PyErr_SetString(PyExc_TypeError,
                        "one_segment(buf: bytearray | bytes, pos: int, max_words: int)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    long long limit = PyLong_AsLongLong(args[2]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = is_bytes ? PyBytes_GET_SIZE(args[0]) : PyByteArray_GET_SIZE(args[0]);
    if (pos < 0 || size - pos < 8)
        Py_RETURN_NONE;
    const char *start = is_bytes ? PyBytes_AS_STRING(args[0]) : PyByteArray_AS_STRING(args[0]);
    const uint8_t *head = (const uint8_t *)start + pos;
    uint64_t table = load64(head);
    long long words = (long long)(table >> 32);
    if ((table & 0xFFFFFFFFu) != 0 || words > limit || words > (size - pos - 8) >> 3)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)head + 8, (Py_ssize_t)(words << 3));
}

/* ``frame_one(segment)``: a one-segment message in the standard stream framing (its table:
 * count - 1 = 0, then the segment's size in words), as one new ``bytes`` object: what
 * ``to_bytes`` returns, without the table's own object and a concatenation. */
static PyObject *
py_frame_one(PyObject *self, PyObject *segment)
{
    if (!PyByteArray_CheckExact(segment)) {
        PyErr_SetString(PyExc_TypeError, "frame_one(segment: bytearray)");
        return NULL;
    }
    Py_ssize_t size = PyByteArray_GET_SIZE(segment);
    if ((size & 7) != 0 || (size >> 3) > 0xFFFFFFFFll) {
        PyErr_SetString(PyExc_ValueError, "a segment is a whole number of words, under 2**32");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size + 8);
    if (out == NULL)
        return NULL;
    uint8_t *at = (uint8_t *)PyBytes_AS_STRING(out);
    uint64_t table = (uint64_t)(size >> 3) << 32; /* little-endian: count - 1, then size */
    memcpy(at, &table, 8);
    memcpy(at + 8, PyByteArray_AS_STRING(segment), (size_t)size);
    return out;
}

/* ---------------------------------------------------------------- the Program type */
/* Drop the references ``count`` fields hold, and free them. */
static void
free_fields(Field *fields, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_CLEAR(fields[i].sub);
        Py_CLEAR(fields[i].members);
        Py_CLEAR(fields[i].field);
        Py_CLEAR(fields[i].key);
        Py_CLEAR(fields[i].name);
    }
    PyMem_Free(fields);
}

static void
clear_fields(Program *p)
{
    if (p->fields == NULL)
        return;
    free_fields(p->fields, p->count);
    p->fields = NULL;
    p->count = 0;
    PyMem_Free(p->pointer_order);
    p->pointer_order = NULL;
    p->pointer_count = 0;
    PyMem_Free(p->flat);
    p->flat = NULL;
    p->flat_count = 0;
    PyMem_Free(p->flat_pointers);
    p->flat_pointers = NULL;
    p->flat_pointer_count = 0;
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

/* program.set(data_words, pointers, disc_at, width, fields, pointer_order): each field a
 * tuple (kind, orig_kind, offset, width, signed, xor_bits, disc, sub, members, field, key,
 * name, row_at, spliced); pointer_order a tuple of field indices. */
static PyObject *
Program_set(Program *self, PyObject *args)
{
    Py_ssize_t data_words, pointers, disc_at, row_width;
    PyObject *fields, *order;
    if (!PyArg_ParseTuple(args, "nnnnO!O!", &data_words, &pointers, &disc_at, &row_width,
                          &PyTuple_Type, &fields, &PyTuple_Type, &order))
        return NULL;
    if (self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "a program is set once");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    Py_ssize_t order_count = PyTuple_GET_SIZE(order);
    Py_ssize_t *pointer_order = PyMem_Calloc(order_count ? order_count : 1, sizeof(Py_ssize_t));
    if (pointer_order == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < order_count; i++) {
        Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(order, i));
        if (index < 0 || index >= count) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a pointer order names no field");
            PyMem_Free(pointer_order);
            return NULL;
        }
        pointer_order[i] = index;
    }
    Field *made = PyMem_Calloc(count ? count : 1, sizeof(Field));
    if (made == NULL) {
        PyMem_Free(pointer_order);
        return PyErr_NoMemory();
    }
    /* The fields tile the row, in order: every item of a row read is set (a tuple with
     * an item left NULL would crash whoever reads it). */
    Py_ssize_t next_at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Field *f = &made[i];
        PyObject *sub, *members, *field, *key, *name;
        unsigned long long xor_bits;
        int kind, orig_kind, width, is_signed, offset, disc, spliced;
        Py_ssize_t row_at;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, i), "iiiipKiOOOUUnp", &kind, &orig_kind,
                              &offset, &width, &is_signed, &xor_bits, &disc, &sub, &members,
                              &field, &key, &name, &row_at, &spliced))
            goto fail;
        int needs_sub = kind == K_STRUCT || kind == K_GROUP || kind == K_LIST;
        /* Where its values go in a row: one, or a spliced group's (its ready program's). */
        Py_ssize_t takes = 1;
        if (spliced) {
            if (kind != K_GROUP || !PyObject_TypeCheck(sub, &ProgramType)
                || !((Program *)sub)->ready) {
                PyErr_Format(PyExc_ValueError, "field %zd of a program is malformed", i);
                goto fail;
            }
            takes = ((Program *)sub)->width;
        }
        if (row_at != next_at || row_at + takes > row_width) {
            PyErr_Format(PyExc_ValueError, "field %zd of a program is not where its row has it", i);
            goto fail;
        }
        next_at += takes;
        if ((needs_sub && !PyObject_TypeCheck(sub, &ProgramType))
            || (kind == K_ENUM && !PyTuple_Check(members)) || offset < 0
            || (kind == K_INT && width != 1 && width != 2 && width != 4 && width != 8)
            || (kind == K_FLOAT && width != 4 && width != 8)) {
            PyErr_Format(PyExc_ValueError, "field %zd of a program is malformed", i);
            goto fail;
        }
        f->kind = kind;
        f->orig_kind = orig_kind;
        f->offset = offset;
        f->width = width;
        f->is_signed = is_signed;
        f->xor_bits = xor_bits;
        f->disc = disc;
        f->sub = needs_sub ? Py_NewRef(sub) : NULL;
        f->members = kind == K_ENUM ? Py_NewRef(members) : NULL;
        f->field = Py_NewRef(field);
        f->key = Py_NewRef(key);
        f->name = Py_NewRef(name);
        f->row_at = row_at;
        f->spliced = spliced;
    }
    if (next_at != row_width) {
        PyErr_SetString(PyExc_ValueError, "a program's fields do not fill its row");
        goto fail;
    }
    Py_ssize_t flat_count = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        flat_count += made[i].spliced ? ((Program *)made[i].sub)->flat_count : 1;
    Field *flat = PyMem_Calloc(flat_count ? flat_count : 1, sizeof(Field));
    if (flat == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int flat_has_via = 0;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Field *f = &made[i];
        if (!f->spliced) {
            flat[n] = *f;
            flat[n].disc_at = disc_at;
            flat[n].owner = (PyObject *)self;
            flat_has_via |= f->kind == K_VIA || f->kind == K_ENUM;
            n++;
            continue;
        }
        Program *group = (Program *)f->sub; /* (ready: checked above) */
        for (Py_ssize_t j = 0; j < group->flat_count; j++) {
            flat[n] = group->flat[j];
            flat[n].row_at += f->row_at;
            n++;
        }
        flat_has_via |= group->flat_has_via;
    }
    /* The encoder's pointer order along ``flat``: ``pointer_order`` itself where nothing
     * is spliced (``flat`` is ``fields`` then), else the schema order it is then, each
     * spliced group's fields that may hold a pointer in its place. */
    Py_ssize_t *flat_pointers = PyMem_Calloc(flat_count ? flat_count : 1, sizeof(Py_ssize_t));
    if (flat_pointers == NULL) {
        PyMem_Free(flat);
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t flat_pointer_count = 0;
    int any_spliced = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        any_spliced |= made[i].spliced;
    if (!any_spliced) {
        for (Py_ssize_t i = 0; i < order_count; i++)
            flat_pointers[flat_pointer_count++] = pointer_order[i];
    }
    else {
        for (Py_ssize_t i = 0; i < flat_count; i++) {
            if (may_hold_pointer(flat[i].orig_kind))
                flat_pointers[flat_pointer_count++] = i;
        }
    }
    self->fields = made;
    self->count = count;
    self->width = row_width;
    self->data_words = data_words;
    self->pointers = pointers;
    self->disc_at = disc_at;
    self->pointer_order = pointer_order;
    self->pointer_count = order_count;
    self->flat = flat;
    self->flat_count = flat_count;
    self->flat_has_via = flat_has_via;
    self->flat_pointers = flat_pointers;
    self->flat_pointer_count = flat_pointer_count;
    self->ready = 1;
    Py_RETURN_NONE;
fail:
    PyMem_Free(pointer_order);
    free_fields(made, count);
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
        Py_VISIT(self->fields[i].key);
        Py_VISIT(self->fields[i].name);
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

/* ``use_shuffle(on)``: whether packing now uses the byte shuffle (it cannot where the CPU
 * has none); tests run both loops with it. */
static PyObject *
py_use_shuffle(PyObject *self, PyObject *on)
{
    int wanted = PyObject_IsTrue(on);
    if (wanted < 0)
        return NULL;
#ifdef HAVE_SHUFFLE
    shuffle_ok = wanted && __builtin_cpu_supports("ssse3");
    return PyBool_FromLong(shuffle_ok);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef module_methods[] = {
    {"root_row", (PyCFunction)(void (*)(void))py_root_row, METH_FASTCALL,
     "The row of a one-segment message's root, or None to read it in Python."},
    {"struct_row", (PyCFunction)(void (*)(void))py_struct_row, METH_FASTCALL,
     "The row of one struct, or None to read it in Python."},
    {"element_rows", (PyCFunction)(void (*)(void))py_element_rows, METH_FASTCALL,
     "The rows of a checked list of structs, or None to read them in Python."},
    {"encode_framed", (PyCFunction)(void (*)(void))py_encode_framed, METH_FASTCALL,
     "encode_root's message as its bytes in the stream framing, or None."},
    {"encode_root", (PyCFunction)(void (*)(void))py_encode_root, METH_FASTCALL,
     "A whole message from the root's values, or None to encode them in Python."},
    {"pack", (PyCFunction)py_pack, METH_O, "The packed encoding of whole words."},
    {"use_shuffle", (PyCFunction)py_use_shuffle, METH_O,
     "Whether packing uses the byte shuffle (SSSE3), set to ``on`` where the CPU has it."},
    {"pack_framed", (PyCFunction)py_pack_framed, METH_O,
     "The packed encoding of a one-segment message in the stream framing."},
    {"unpack_segment", (PyCFunction)(void (*)(void))py_unpack_segment, METH_FASTCALL,
     "The one segment of a packed framed message, or None to read it in Python."},
    {"frame_one", (PyCFunction)py_frame_one, METH_O,
     "A one-segment message in the stream framing, as bytes."},
    {"one_segment", (PyCFunction)(void (*)(void))py_one_segment, METH_FASTCALL,
     "The body of a complete one-segment framed message in a bytearray, or None."},
    {"unpack", (PyCFunction)(void (*)(void))py_unpack, METH_FASTCALL,
     "The words a packed stream encodes, or None to decode it in Python."},
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
    str_budget = PyUnicode_InternFromString("budget");
    if (str_budget == NULL)
        return NULL;
    fill_bits_set();
    fill_stored_before();
#ifdef HAVE_SHUFFLE
    fill_shuffle_masks();
#endif
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

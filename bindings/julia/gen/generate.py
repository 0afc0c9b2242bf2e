#!/usr/bin/python3
"""Generates the Julia mirror of weft's C ABI.

Reads capi/include/weft/weft.h and writes bindings/julia/Weft/src/capi.jl: one Julia
function per WEFT_API function (a ccall with the exact C types), the structs the functions
take (the DLPack structs and weft's option structs), the weft_status values and the version
macros as constants.

    /usr/bin/python3 bindings/julia/gen/generate.py            # (re)write capi.jl
    /usr/bin/python3 bindings/julia/gen/generate.py --check    # exit 1 with a diff if stale

The header is parsed by a deliberately small C reader that knows the few shapes weft.h uses
(object-like #defines, typedef'd enums and structs, WEFT_API function declarations,
#if/#ifdef blocks). Anything else makes it stop with an error naming the line: a binding
generated from a half-understood header is worse than none. Standard library only; the
output depends on nothing but the header, so it is deterministic.
"""

import argparse
import difflib
import os
import re
import sys
import textwrap

# Paths relative to the repository root (this file is bindings/julia/gen/generate.py).
# abspath, not realpath: under Bazel the script is a symlink in a runfiles tree.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
HEADER_REL = "capi/include/weft/weft.h"
TRAINER_HEADER_REL = "capi/include/weft/trainer.h"
OUTPUT_REL = "bindings/julia/Weft/src/capi.jl"
GENERATOR_REL = "bindings/julia/gen/generate.py"


class HeaderError(Exception):
    """The header has a construct this generator does not understand."""

    def __init__(self, line, message):
        super().__init__(message)
        self.line = line  # 0 when the problem is not on one line


# ---- C types -> Julia types --------------------------------------------------------------

# Scalar C types by spelling (qualifiers removed). Enums are C ints on every ABI Julia runs
# on, so weft_status is Cint.
C_SCALARS = {
    "void": "Cvoid",
    "char": "Cchar",
    "int": "Cint",
    "unsigned int": "Cuint",
    "unsigned": "Cuint",
    "size_t": "Csize_t",
    "double": "Cdouble",
    "float": "Cfloat",
    "int8_t": "Int8",
    "uint8_t": "UInt8",
    "int16_t": "Int16",
    "uint16_t": "UInt16",
    "int32_t": "Int32",
    "uint32_t": "UInt32",
    "int64_t": "Int64",
    "uint64_t": "UInt64",
}

# Names Julia does not accept as a plain argument name.
JULIA_RESERVED = {
    "abstract", "baremodule", "begin", "break", "catch", "const", "continue", "do",
    "else", "elseif", "end", "export", "false", "finally", "for", "function", "global",
    "if", "import", "in", "isa", "let", "local", "macro", "module", "mutable", "outer",
    "primitive", "public", "quote", "return", "struct", "true", "try", "type", "using",
    "where", "while",
}

# DLPack (dlpack/dlpack.h) is part of the ABI but not of weft.h. Its struct layout has been
# stable since v0.6 (DLDevice), so the mirror is written down here rather than read from
# whichever dlpack.h is installed: the output must not depend on the machine. The binding
# test checks these against the installed dlpack.h.
DLPACK_STRUCTS = [
    ("DLDevice", "The device of a tensor: device_type is a DLDeviceType (kDLCPU).", [
        ("device_type", "Cint", "DLDeviceType, a C enum"),
        ("device_id", "Cint", None),
    ]),
    ("DLDataType", "Element type: code is kDLInt, kDLUInt, kDLFloat or kDLBfloat; bits per "
                   "element; lanes 1.", [
        ("code", "UInt8", None),
        ("bits", "UInt8", None),
        ("lanes", "UInt16", None),
    ]),
    ("DLTensor", "A tensor that does not own its memory; strides NULL means compact "
                 "row-major.", [
        ("data", "Ptr{Cvoid}", None),
        ("device", "DLDevice", None),
        ("ndim", "Cint", None),
        ("dtype", "DLDataType", None),
        ("shape", "Ptr{Int64}", None),
        ("strides", "Ptr{Int64}", None),
        ("byte_offset", "UInt64", None),
    ]),
    ("DLManagedTensor", "A tensor with an owner: call deleter(self) when done with it.", [
        ("dl_tensor", "DLTensor", None),
        ("manager_ctx", "Ptr{Cvoid}", None),
        ("deleter", "Ptr{Cvoid}", "void (*)(struct DLManagedTensor* self)"),
    ]),
]
DLPACK_CONSTANTS = [
    ("kDLCPU", "Cint(1)", "DLDeviceType: host memory"),
    ("kDLInt", "UInt8(0)", "DLDataTypeCode: signed integer"),
    ("kDLUInt", "UInt8(1)", "DLDataTypeCode: unsigned integer"),
    ("kDLFloat", "UInt8(2)", "DLDataTypeCode: IEEE floating point"),
    ("kDLBfloat", "UInt8(4)", "DLDataTypeCode: bfloat16"),
]


def julia_name(name):
    return name + "_" if name in JULIA_RESERVED else name


class TypeMapper:
    """Maps a C declaration (type plus optional name) to a Julia type."""

    def __init__(self):
        self.structs = {"DLTensor", "DLManagedTensor", "DLDevice", "DLDataType"}
        self.enums = set()

    def parse_declarator(self, text, line):
        """'const DLTensor* in' -> (base spelling, pointer depth, name or None,
        is a function pointer)."""
        text = " ".join(text.split())
        fnptr = re.fullmatch(r"(.+?)\(\s*\*\s*(\w*)\s*\)\s*\((.*)\)", text)
        if fnptr:
            return None, 1, fnptr.group(2) or None, True
        if "[" in text:
            raise HeaderError(line, "array declarators are not supported: %r" % text)
        tokens = re.findall(r"[A-Za-z_]\w*|\*|\S", text)
        stray = [t for t in tokens if not (t == "*" or re.fullmatch(r"[A-Za-z_]\w*", t))]
        if stray:
            raise HeaderError(line, "cannot read declaration %r" % text)
        depth = tokens.count("*")
        words = [t for t in tokens if t != "*" and t not in ("const", "volatile", "struct",
                                                              "enum")]
        name = None
        # The last word is the declared name unless the words alone form the type.
        if len(words) >= 2 and tokens[-1] != "*" and not self._is_type(" ".join(words)):
            name = words.pop()
        base = " ".join(words)
        if not self._is_type(base):
            raise HeaderError(line, "unknown C type %r in %r" % (base, text))
        return base, depth, name, False

    def _is_type(self, base):
        return base in C_SCALARS or base in self.structs or base in self.enums

    def julia_type(self, base, depth, fnptr, role, const=True):
        """role: 'param' (a const char* is a Cstring; a char* buffer the callee writes,
        const False, is a Ptr{Cchar}), 'return' or 'field'."""
        if fnptr:
            return "Ptr{Cvoid}"  # a C function pointer, e.g. from @cfunction
        if base in self.enums:
            jl = "Cint"
        elif base in C_SCALARS:
            jl = C_SCALARS[base]
        else:
            jl = base
        if role == "param" and base == "char" and depth == 1 and const:
            # Julia checks a Cstring argument for embedded NULs and passes it NUL-ended.
            # Returned strings (and char** out-parameters) stay Ptr{Cchar}: they may be
            # NULL and are read with unsafe_string.
            return "Cstring"
        for _ in range(depth):
            jl = "Ptr{%s}" % jl
        return jl


# ---- reading the header ------------------------------------------------------------------

class Item:
    """One top-level thing in the header, with the comment just above it."""

    def __init__(self, kind, line, text, doc):
        self.kind = kind  # 'define', 'decl' or 'section'
        self.line = line
        self.text = text
        self.doc = doc  # list of comment lines (may be empty)


def comment_lines(comment):
    """'/* a\n * b */' -> ['a', 'b']."""
    body = comment[2:-2]
    lines = []
    for raw in body.split("\n"):
        raw = raw.strip()
        if raw.startswith("*"):
            raw = raw[1:]
            if raw.startswith(" "):
                raw = raw[1:]
        lines.append(raw.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return lines


SECTION_RE = re.compile(r"^-{2,}\s*(.*?)\s*-*$")


class PreprocessorState:
    """Tracks #if/#ifdef nesting. The header is read as a C99 compiler without GNU
    extensions would: __cplusplus, __GNUC__ and __clang__ are not defined."""

    def __init__(self):
        self.defined = set()
        self.stack = []  # (active, any_branch_taken, parent_active)

    def active(self):
        return all(frame[0] for frame in self.stack)

    def evaluate(self, expr, line):
        expr = expr.strip()
        py = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)",
                    lambda m: str((m.group(1) or m.group(2)) in self.defined), expr)
        py = py.replace("||", " or ").replace("&&", " and ")
        py = re.sub(r"!(?!=)", " not ", py)
        if not re.fullmatch(r"[\sA-Za-z0-9()]*", py) or re.search(
                r"\b(?!True\b|False\b|and\b|or\b|not\b)[A-Za-z_]\w*", py):
            raise HeaderError(line, "cannot evaluate #if %s" % expr)
        return bool(eval(py, {"__builtins__": {}}, {}))  # only True/False/and/or/not

    def directive(self, text, line):
        """Handles one preprocessor line; returns ('define', name, value) for #define in
        an active region, ('include',) for #include, else None."""
        m = re.fullmatch(r"#\s*(\w+)\s*(.*)", text, re.S)
        if not m:
            raise HeaderError(line, "cannot read directive %r" % text)
        word, rest = m.group(1), m.group(2).strip()
        if word in ("ifdef", "ifndef"):
            value = rest in self.defined
            value = value if word == "ifdef" else not value
            parent = self.active()
            self.stack.append([parent and value, value, parent])
        elif word == "if":
            parent = self.active()
            value = self.evaluate(rest, line) if parent else False
            self.stack.append([parent and value, value, parent])
        elif word == "elif":
            frame = self._top(line)
            value = (not frame[1]) and frame[2] and self.evaluate(rest, line)
            frame[0] = value
            frame[1] = frame[1] or value
        elif word == "else":
            frame = self._top(line)
            frame[0] = frame[2] and not frame[1]
            frame[1] = True
        elif word == "endif":
            self._top(line)
            self.stack.pop()
        elif not self.active():
            return None
        elif word == "define":
            d = re.fullmatch(r"(\w+)(\(?)(.*)", rest, re.S)
            if d.group(2):
                raise HeaderError(line, "function-like macros are not supported: %r" % text)
            self.defined.add(d.group(1))
            return ("define", d.group(1), " ".join(d.group(3).split()))
        elif word == "include":
            return ("include",)
        else:
            raise HeaderError(line, "unsupported directive #%s" % word)
        return None

    def _top(self, line):
        if not self.stack:
            raise HeaderError(line, "#else/#elif/#endif without #if")
        return self.stack[-1]


def read_header(text):
    """Splits the header into Items (in order), keeping comments as docs."""
    items = []
    pp = PreprocessorState()
    pending_doc = []  # comment lines seen since the last item
    decl = []  # characters of the declaration being read
    decl_line = 0
    brace_depth = 0
    i, n, line = 0, len(text), 1
    first_comment = True
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise HeaderError(line, "unterminated comment")
            comment = text[i:end + 2]
            if not pp.active():
                pass  # inside #ifdef __cplusplus and the like
            elif decl:
                # A comment inside a declaration (e.g. after an enum value) stays in it:
                # it becomes that member's trailing comment.
                decl.append(comment)
            elif first_comment:
                pass  # the file's preamble: capi.jl points at the header instead
            else:
                lines = comment_lines(comment)
                section = SECTION_RE.match(lines[0]) if len(lines) == 1 else None
                if section:
                    items.append(Item("section", line, section.group(1), []))
                    pending_doc = []
                else:
                    pending_doc = lines
            first_comment = False
            line += comment.count("\n")
            i = end + 2
            continue
        if c == "#" and not decl and (i == 0 or text[i - 1] == "\n" or
                                      text[text.rfind("\n", 0, i) + 1:i].strip() == ""):
            # A directive runs to the end of the line, with backslash continuations.
            start_line = line
            j = i
            while True:
                eol = text.find("\n", j)
                eol = n if eol < 0 else eol
                if text[j:eol].rstrip().endswith("\\") and eol < n:
                    j = eol + 1
                    continue
                break
            directive = text[i:eol].replace("\\\n", " ")
            directive = re.sub(r"/\*.*?\*/", " ", directive, flags=re.S)
            line += text[i:eol].count("\n")
            i = eol
            result = pp.directive(directive.strip(), start_line)
            if result and result[0] == "define":
                items.append(Item("define", start_line, (result[1], result[2]),
                                  pending_doc))
                pending_doc = []
            continue
        if c == "\n":
            line += 1
            if decl:
                decl.append(c)
            i += 1
            continue
        if not pp.active():
            i += 1
            continue
        if c.isspace() and not decl:
            i += 1
            continue
        if not decl:
            decl_line = line
        decl.append(c)
        if c == "{":
            brace_depth += 1
        elif c == "}":
            brace_depth -= 1
        elif c == ";" and brace_depth == 0:
            items.append(Item("decl", decl_line, "".join(decl), pending_doc))
            pending_doc = []
            decl = []
        i += 1
    if decl:
        raise HeaderError(decl_line, "declaration without ';': %r" % "".join(decl)[:60])
    if pp.stack:
        raise HeaderError(line, "#if without #endif")
    return items


# ---- the model: what capi.jl will hold ---------------------------------------------------

def split_top_level(text, sep=","):
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def members_with_comments(body):
    """The members of a braced enum or struct body, each as (code, comment or None).
    A comment on a member's line, after it, is that member's; any other comment goes to
    the member that follows it."""
    members = []
    code, comments = [], []
    finished = None  # the member just ended by ',' or ';', while still on its line
    depth, i = 0, 0
    while i < len(body):
        if body.startswith("/*", i):
            end = body.index("*/", i) + 2
            text = " ".join(body[i + 2:end - 2].split())
            (finished[1] if finished is not None else comments).append(text)
            i = end
            continue
        c = body[i]
        i += 1
        if c == "\n":
            finished = None
            code.append(" ")
        elif c in ",;" and depth == 0:
            member = " ".join("".join(code).split())
            if member:
                finished = [member, comments]
                members.append(finished)
            code, comments = [], []
        else:
            depth += (c == "(") - (c == ")")
            if not c.isspace():
                finished = None
            code.append(c)
    member = " ".join("".join(code).split())
    if member:
        members.append([member, comments])
    return [(m, "; ".join(c) or None) for m, c in members]


class Model:
    def __init__(self):
        self.types = TypeMapper()
        self.sections = []  # list of (kind, payload) in header order
        self.inits = {}  # struct name -> list of Julia init values
        self.int_macros = {}  # name -> Julia expression
        self.enum_members = set()  # enumerators (Cint constants in capi.jl)

    def add(self, kind, payload):
        self.sections.append((kind, payload))


def julia_int_expr(value, known):
    """A #define's value when it is an integer expression over integers and earlier
    macros, written in Julia; else None."""
    tokens = re.findall(r"\d+[uUlL]*|[A-Za-z_]\w*|\S", value)
    out = []
    for t in tokens:
        if re.fullmatch(r"\d+[uUlL]*", t):
            out.append(t.rstrip("uUlL"))
        elif re.fullmatch(r"[A-Za-z_]\w*", t):
            if t not in known:
                return None
            out.append(t)
        elif t in "+-*()":
            out.append(t)
        else:
            return None
    if not out:
        return None
    expr = " ".join(out).replace("( ", "(").replace(" )", ")")
    if expr.startswith("(") and expr.endswith(")") and expr.count("(") == 1:
        expr = expr[1:-1]
    return expr


FLOAT_LITERAL = r"\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+"


def julia_float_expr(value):
    """True for arithmetic on floating-point literals only (`1.0 / 3.0`): C and Julia
    evaluate it alike, in IEEE double, with the same precedence. An integer literal is not
    accepted (C's 1 / 3 is 0, Julia's 0.333...)."""
    tokens = re.findall(FLOAT_LITERAL + r"|\d+|\S", value)
    if not any(re.fullmatch(FLOAT_LITERAL, t) for t in tokens):
        return False
    return all(re.fullmatch(FLOAT_LITERAL, t) or t in "+-*/()" for t in tokens)


def build_model(items):
    model = Model()
    for item in items:
        if item.kind == "section":
            model.add("section", item.text)
        elif item.kind == "define":
            name, value = item.text
            if name == "WEFT_API" or not value:
                continue  # the export attribute, and the include guard
            if value.startswith("{"):
                if not name.endswith("_INIT"):
                    raise HeaderError(item.line,
                                      "brace initializer %s is not an _INIT" % name)
                inner = value.strip()[1:-1]
                model.inits[name] = [v.strip() for v in split_top_level(inner)]
                continue
            expr = julia_int_expr(value, model.int_macros)
            if expr is None:
                raise HeaderError(item.line,
                                  "cannot translate #define %s %s" % (name, value))
            model.int_macros[name] = expr
            model.add("const", (name, expr, item.doc))
        elif item.kind == "decl":
            parse_declaration(model, item)
    # Every _INIT belongs to the struct of the same name.
    structs = {p[0]: p for k, p in model.sections if k == "struct"}
    for init_name, values in model.inits.items():
        struct_name = init_name[:-len("_INIT")].lower()
        if struct_name not in structs:
            raise HeaderError(0, "%s has no struct %s" % (init_name, struct_name))
        fields = structs[struct_name][1]
        if len(values) != len(fields):
            raise HeaderError(0, "%s has %d values for %d fields of %s" % (
                init_name, len(values), len(fields), struct_name))
        translated = []
        for v in values:
            if v == "NULL":
                translated.append("C_NULL")
            elif re.fullmatch(r"-?\d+(\.\d*)?([eE][-+]?\d+)?", v) or v in model.int_macros \
                    or v in model.enum_members or julia_float_expr(v):
                translated.append(v)
            else:
                raise HeaderError(0, "cannot translate %r in %s" % (v, init_name))
        structs[struct_name][3] = (init_name, translated)
    return model


def parse_declaration(model, item):
    types = model.types
    code = " ".join(strip_comments(item.text).split())
    # typedef enum name { ... } name;
    m = re.fullmatch(r"typedef enum (\w+)?\s*\{(.*)\}\s*(\w+)\s*;", code)
    if m:
        body = item.text[item.text.index("{") + 1:item.text.rindex("}")]
        values, next_value = [], 0
        for member, comment in members_with_comments(body):
            mm = re.fullmatch(r"(\w+)(?:\s*=\s*(-?\d+))?", member)
            if not mm:
                raise HeaderError(item.line, "cannot read enum member %r" % member)
            if mm.group(2) is not None:
                next_value = int(mm.group(2))
            values.append((mm.group(1), next_value, comment))
            next_value += 1
        types.enums.add(m.group(3))
        if m.group(1):
            types.enums.add(m.group(1))
        model.enum_members.update(v[0] for v in values)
        model.add("enum", (m.group(3), values, item.doc))
        return
    # typedef struct name name;  (opaque handle)
    m = re.fullmatch(r"typedef struct (\w+) (\w+)\s*;", code)
    if m:
        if m.group(1) != m.group(2):
            raise HeaderError(item.line, "typedef name differs from the struct tag")
        types.structs.add(m.group(2))
        model.add("opaque", (m.group(2), item.doc))
        return
    # typedef struct name { fields } name;
    m = re.fullmatch(r"typedef struct (\w+)?\s*\{(.*)\}\s*(\w+)\s*;", code)
    if m:
        name = m.group(3)
        body = item.text[item.text.index("{") + 1:item.text.rindex("}")]
        fields = []
        for member, comment in members_with_comments(body):
            base, depth, fname, fnptr = types.parse_declarator(member, item.line)
            if fname is None:
                raise HeaderError(item.line, "unnamed field in %s" % name)
            fields.append((fname, types.julia_type(base, depth, fnptr, "field"), comment))
        types.structs.add(name)
        # [name, fields, doc, init] (init filled in once the _INIT macro is known)
        model.add("struct", [name, fields, item.doc, None])
        return
    # WEFT_API <return type> <name>(<parameters>);
    m = re.fullmatch(r"WEFT_API (.+?)\b(\w+)\s*\((.*)\)\s*;", code)
    if m:
        ret_text, name, params_text = m.group(1), m.group(2), m.group(3)
        base, depth, _, fnptr = types.parse_declarator(ret_text, item.line)
        ret = types.julia_type(base, depth, fnptr, "return")
        params = []
        if params_text.strip() not in ("", "void"):
            for k, p in enumerate(split_top_level(params_text)):
                base, depth, pname, fnptr = types.parse_declarator(p, item.line)
                if base == "void" and depth == 0:
                    raise HeaderError(item.line, "void parameter in %s" % name)
                const = re.match(r"\s*const\b", p) is not None
                params.append((julia_name(pname or "arg%d" % (k + 1)),
                               types.julia_type(base, depth, fnptr, "param", const)))
        prototype = "%s %s(%s)" % (ret_text.strip().replace(" *", "*"), name,
                                   ", ".join(" ".join(p.split()) for p in
                                             split_top_level(params_text)))
        model.add("function", (name, ret, params, item.doc, prototype))
        return
    raise HeaderError(item.line, "unsupported declaration: %r" % code[:80])


# ---- writing capi.jl ---------------------------------------------------------------------

PREAMBLE = """\
# generated by bindings/julia/gen/generate.py from capi/include/weft/weft.h and trainer.h;
# do not edit
#
# The low-level mirror of weft's C ABI: one Julia function per WEFT_API function, calling it
# with the exact C types, plus the structs and constants those functions use. The header
# states the conventions (status codes, out-parameters first, buffer/capacity/count arrays,
# string lifetimes); Weft.jl builds the Julia API on top of this module.
# Regenerate after changing the header:
#     /usr/bin/python3 bindings/julia/gen/generate.py

module CAPI

# The shared libraries: ENV["LIBWEFT"] (a path, e.g. bazel-bin/capi/libweft.so) when the
# module is loaded, else "libweft" found on the dynamic loader's search path; the same for
# the trainer's (trainer.h: LIBWEFT_TRAINER, "libweft_trainer"), which loads LibTorch and is
# only opened by the first trainer call. Every ccall names its library through libweft()
# or libweft_trainer(); Julia resolves it on a function's first call and keeps the result,
# so the variables must be set before the first call into weft.
const _libweft_path = Ref("libweft")
libweft() = _libweft_path[]
const _libweft_trainer_path = Ref("libweft_trainer")
libweft_trainer() = _libweft_trainer_path[]

function __init__()
    _libweft_path[] = get(ENV, "LIBWEFT", "libweft")
    _libweft_trainer_path[] = get(ENV, "LIBWEFT_TRAINER", "libweft_trainer")
end
"""


def banner(title):
    line = "# ---- %s " % title
    return line + "-" * max(3, 92 - len(line)) + "\n"


def comment_block(lines, indent=""):
    return "".join(("%s# %s" % (indent, l)).rstrip() + "\n" for l in lines)


def emit_struct(out, name, fields, doc):
    out.append("\n")
    out.append(comment_block(doc))
    if not fields:
        # An opaque C type: only ever seen through a Ptr{...}.
        out.append("mutable struct %s end\n" % name)
        return
    out.append("struct %s\n" % name)
    for fname, ftype, comment in fields:
        line = "    %s::%s" % (fname, ftype)
        if comment:
            line += "  # " + comment
        out.append(line + "\n")
    out.append("end\n")


WIDTH = 92  # the repository's line length


def wrap_list(items, first_prefix, indent, last_suffix):
    """Comma-separated items after first_prefix, continued on lines starting with
    indent, with last_suffix after the final item; at most WIDTH columns where possible."""
    lines, line = [], first_prefix
    for k, item in enumerate(items):
        word = item + ("," if k + 1 < len(items) else last_suffix)
        if line not in (first_prefix, indent) and len(line) + 1 + len(word) > WIDTH:
            lines.append(line.rstrip())
            line = indent
        if line in (first_prefix, indent):
            line += word
        else:
            line += " " + word
    lines.append(line)
    return "\n".join(lines) + "\n"


def emit_function(out, name, ret, params, doc, prototype, library="libweft()"):
    out.append("\n")
    out.append(comment_block(doc))
    out.append("".join("%s\n" % l for l in textwrap.wrap(
        prototype, WIDTH, initial_indent="# C: ", subsequent_indent="#        ",
        break_on_hyphens=False)))
    names = [p[0] for p in params]
    types = [p[1] for p in params]
    out.append(wrap_list(names, "function %s(" % name, "        ", ")") if names
               else "function %s()\n" % name)
    if not params:
        out.append("    ccall((:%s, %s), %s, ())\n" % (name, library, ret))
    else:
        types_tuple = "(%s%s)" % (", ".join(types), "," if len(types) == 1 else "")
        one_line = "    ccall((:%s, %s), %s, %s, %s)" % (
            name, library, ret, types_tuple, ", ".join(names))
        if len(one_line) <= WIDTH:
            out.append(one_line + "\n")
        else:
            out.append("    ccall((:%s, %s), %s,\n" % (name, library, ret))
            if len(types) == 1:
                out.append("          %s,\n" % types_tuple)
            else:
                out.append(wrap_list(types, "          (", "           ", "),"))
            out.append(wrap_list(names, "          ", "          ", ")"))
    out.append("end\n")


def trainer_functions(trainer_text):
    """The WEFT_API functions of trainer.h: they live in libweft_trainer."""
    return set(re.findall(r"WEFT_API[^;(]*?\b(weft_\w+)\s*\(", trainer_text))


def generate(header_text, trainer_text=""):
    """capi.jl from weft.h and trainer.h (read as one header: trainer.h only adds)."""
    model = build_model(read_header(header_text + "\n" + trainer_text))
    in_trainer = trainer_functions(trainer_text)
    out = [PREAMBLE]
    exported = ["libweft", "libweft_trainer"]

    out.append("\n" + banner("DLPack (dlpack/dlpack.h)"))
    for name, value, comment in DLPACK_CONSTANTS:
        out.append("const %s = %s  # %s\n" % (name, value, comment))
        exported.append(name)
    for name, doc, fields in DLPACK_STRUCTS:
        emit_struct(out, name, fields, textwrap.wrap(doc, 88))
        exported.append(name)

    previous = None
    for kind, payload in model.sections:
        if kind == "const" and previous not in ("const", "section"):
            out.append("\n")
        previous = kind
        if kind == "section":
            out.append("\n" + banner(payload))
        elif kind == "const":
            name, expr, doc = payload
            out.append(comment_block(doc))
            line = "const %s = %s" % (name, expr)
            if len(line) > WIDTH:
                line = "const %s =\n    %s" % (name, expr)
            out.append(line + "\n")
            exported.append(name)
        elif kind == "enum":
            name, values, doc = payload
            out.append(comment_block(doc))
            out.append("# enum %s (a C int)\n" % name)
            for vname, value, comment in values:
                line = "const %s = Cint(%d)" % (vname, value)
                if comment:
                    line += "  # " + comment
                out.append(line + "\n")
                exported.append(vname)
        elif kind == "opaque":
            name, doc = payload
            emit_struct(out, name, [], doc)
            exported.append(name)
        elif kind == "struct":
            name, fields, doc, init = payload
            emit_struct(out, name, fields, doc)
            exported.append(name)
            if init:
                init_name, values = init
                out.append("\n# %s: the defaults; any field but version may be given by\n"
                           "# keyword.\n" % init_name)
                out.append("function %s(;\n" % name)
                kwargs = [(f[0], v) for f, v in zip(fields, values) if f[0] != "version"]
                for k, (fname, value) in enumerate(kwargs):
                    sep = "," if k + 1 < len(kwargs) else ")"
                    out.append("        %s = %s%s\n" % (fname, value, sep))
                args = [v if f[0] == "version" else f[0] for f, v in zip(fields, values)]
                out.append(wrap_list(args, "    %s(" % name, "        ", ")"))
                out.append("end\n")
        elif kind == "function":
            library = "libweft_trainer()" if payload[0] in in_trainer else "libweft()"
            emit_function(out, *payload, library=library)
            exported.append(payload[0])

    out.append("\n")
    out.append(wrap_list(exported, "export ", "    ", ""))
    out.append("\nend  # module CAPI\n")
    text = "".join(out)
    if not text.isascii():
        raise HeaderError(0, "the header's comments must be ASCII (capi.jl is ASCII)")
    return text


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--header", default=os.path.join(REPO_ROOT, HEADER_REL))
    parser.add_argument("--trainer-header", default=os.path.join(REPO_ROOT, TRAINER_HEADER_REL))
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, OUTPUT_REL))
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory; exit 1 with a diff if --output differs")
    args = parser.parse_args(argv)
    with open(args.header, encoding="utf-8") as f:
        header = f.read()
    with open(args.trainer_header, encoding="utf-8") as f:
        trainer = f.read()
    try:
        text = generate(header, trainer)
    except HeaderError as e:
        where = args.header + (":%d" % e.line if e.line else "")
        print("generate.py: %s: %s" % (where, e), file=sys.stderr)
        return 2
    if args.check:
        try:
            with open(args.output, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(True), text.splitlines(True),
            fromfile=OUTPUT_REL + " (checked in)",
            tofile=OUTPUT_REL + " (from the header)"))
        print("\n%s is stale: run /usr/bin/python3 %s" % (OUTPUT_REL, GENERATOR_REL),
              file=sys.stderr)
        return 1
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""weft_shared_library: a shared library made of the objects of `deps` that `exclude` does not
already hold, linked against the shared libraries in `link`. libweft_trainer.so is built
this way: its own objects (the trainer, pipe/runtime, the LibTorch adapter) and not a second
copy of comm and core, whose one instance (the engine, the settings) lives in libweft.so.
Bazel 4's cc_binary cannot leave a dependency's objects out, hence this rule.

weft_library_link: a symlink (libweft.so.0 -> libweft.so), so that programs linked against a
library whose soname carries the version find it at run time next to the library."""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load(":static_bundle.bzl", "workspace_archives")

def system_link_flags(targets):
    """The link flags below `targets` (the linkopts of @torch, @mpi, ...), each owner's once,
    in link order."""
    flags = []
    owners = {}
    for target in targets:
        for linker_input in target[CcInfo].linking_context.linker_inputs.to_list():
            key = str(linker_input.owner)
            if key not in owners:
                owners[key] = True
                flags.extend(linker_input.user_link_flags)
    return flags

def _shared_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    archives = workspace_archives(ctx.attr.deps, ctx.label.workspace_name, ctx.attr.exclude)

    flags = system_link_flags(ctx.attr.deps)

    out = ctx.actions.declare_file(ctx.attr.out)
    args = ctx.actions.args()
    args.add_all(["-shared", "-o", out])
    args.add("-Wl,-soname," + ctx.attr.soname)
    args.add("-Wl,--version-script=" + ctx.file.version_script.path)

    # Every symbol must resolve against the libraries named here: the check that libweft.so
    # exports what the objects below use.
    args.add("-Wl,-z,defs")
    args.add("-Wl,--whole-archive")
    args.add_all(archives)
    args.add("-Wl,--no-whole-archive")
    args.add_all(ctx.files.link)
    args.add_all(flags)
    args.add_all(["-lstdc++", "-lm", "-pthread"])

    # The build's own --linkopt flags, as Bazel's own rules pass them: --config=asan's
    # -fsanitize=..., without which the sanitized objects' runtime calls stay undefined.
    args.add_all(ctx.fragments.cpp.linkopts)

    # Installed side by side with the libraries in `link`.
    args.add("-Wl,-rpath,$ORIGIN")
    ctx.actions.run(
        executable = cc_toolchain.compiler_executable,
        arguments = [args],
        inputs = depset(
            archives + ctx.files.link + [ctx.file.version_script],
            transitive = [cc_toolchain.all_files],
        ),
        outputs = [out],
        mnemonic = "SharedLibrary",
        # The compiler driver finds ld and its plugins on PATH.
        use_default_shell_env = True,
        progress_message = "Linking %s" % out.short_path,
    )
    return [DefaultInfo(
        files = depset([out]),
        runfiles = ctx.runfiles(files = [out] + ctx.files.link),
    )]

weft_shared_library = rule(
    implementation = _shared_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "exclude": attr.label_list(providers = [CcInfo]),
        "link": attr.label_list(allow_files = True),
        "out": attr.string(mandatory = True),
        "soname": attr.string(mandatory = True),
        "version_script": attr.label(allow_single_file = True, mandatory = True),
        "_cc_toolchain": attr.label(
            default = Label("@bazel_tools//tools/cpp:current_cc_toolchain"),
        ),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def _library_link_impl(ctx):
    out = ctx.actions.declare_file(ctx.attr.out)
    ctx.actions.symlink(output = out, target_file = ctx.file.library)
    return [DefaultInfo(
        files = depset([out]),
        runfiles = ctx.runfiles(files = [out, ctx.file.library]),
    )]

weft_library_link = rule(
    implementation = _library_link_impl,
    attrs = {
        "library": attr.label(allow_single_file = True, mandatory = True),
        "out": attr.string(mandatory = True),
    },
)

def _link_flags_impl(ctx):
    out = ctx.actions.declare_file(ctx.attr.out)
    flags = system_link_flags(ctx.attr.deps)
    excluded = system_link_flags(ctx.attr.exclude)
    kept = [f for f in flags if f not in excluded or not f.startswith("-l")]
    ctx.actions.write(out, "\n".join(kept) + "\n")
    return [DefaultInfo(files = depset([out]))]

# What a program linking a static archive of weft must add: the system libraries' link flags
# of `deps` (less the -l flags `exclude` already brings), one per line. tools/install.sh
# writes them into the pkg-config files' Libs.private.
weft_link_flags = rule(
    implementation = _link_flags_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "exclude": attr.label_list(providers = [CcInfo]),
        "out": attr.string(mandatory = True),
    },
)

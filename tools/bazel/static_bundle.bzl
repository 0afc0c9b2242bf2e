"""weft_static_bundle: one static archive holding the objects of a cc_library and of every
cc_library of this workspace below it (system libraries stay outside: they are linked by
the user), less those of `exclude` (libweft_trainer.a leaves out what libweft.a holds)."""

def workspace_archives(targets, workspace_name, exclude = []):
    """This repository's archives below `targets`, once each, in link order, less those below
    `exclude`. `workspace_name` is "" when weft is the main workspace, "weft" when it is
    another's dependency; system libraries (linkopts only) have no archive."""
    seen = {}
    for target in exclude:
        for linker_input in target[CcInfo].linking_context.linker_inputs.to_list():
            for lib in linker_input.libraries:
                archive = lib.pic_static_library or lib.static_library
                if archive != None:
                    seen[archive.path] = True
    archives = []
    for target in targets:
        for linker_input in target[CcInfo].linking_context.linker_inputs.to_list():
            for lib in linker_input.libraries:
                archive = lib.pic_static_library or lib.static_library
                if archive == None or archive.owner.workspace_name != workspace_name:
                    continue
                if archive.path not in seen:
                    seen[archive.path] = True
                    archives.append(archive)
    return archives

def _static_bundle_impl(ctx):
    archives = workspace_archives(ctx.attr.deps, ctx.label.workspace_name, ctx.attr.exclude)
    out = ctx.actions.declare_file(ctx.attr.out)

    # GNU ar's MRI script merges archives without unpacking them by hand.
    script = "create {}\n{}save\nend\n".format(
        out.path,
        "".join(["addlib {}\n".format(a.path) for a in archives]),
    )
    ctx.actions.run_shell(
        inputs = archives,
        outputs = [out],
        command = "printf '%s' \"$1\" | ar -M",
        arguments = [script],
        mnemonic = "StaticBundle",
        progress_message = "Bundling %s" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]))]

weft_static_bundle = rule(
    implementation = _static_bundle_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "exclude": attr.label_list(providers = [CcInfo]),
        "out": attr.string(mandatory = True),
    },
)

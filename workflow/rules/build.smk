# The native extension (built in place, as `make` does; build.mode "check" only records
# what is installed) and a compile check of the CUDA kernels wherever nvcc exists; then
# the unit tests, with their JUnit XML kept.

BUILD = "true" if config.get("build", {}).get("mode", "install") == "check" else \
    f"{PY} -m pip install --no-build-isolation --no-deps -q -e {BASE}"


rule build_extension:
    output:
        info=f"{OUT}/build/info.json",
        cuda=f"{OUT}/build/cuda_compile.txt",
    log:
        f"{OUT}/logs/build_extension.log",
    params:
        provenance=PROVENANCE_KEY,  # a new commit, torch or machine reruns everything after this rule
    shell:
        "({BUILD} && cd {BASE} && {PY} workflow/scripts/cuda_compile_check.py $OLDPWD/{output.cuda} && cd $OLDPWD"
        " && {PY} -m fp4quant.info --json > {output.info}.tmp && mv {output.info}.tmp {output.info}) > {log} 2>&1"


rule unit_tests:
    input:
        rules.build_extension.output.info,
    output:
        junit=f"{OUT}/tests/junit.xml",
    log:
        f"{OUT}/logs/unit_tests.log",
    params:
        args=config["tests"].get("args", "-q"),
    threads: workflow.cores
    shell:
        "(cd {BASE} && {PY} -m pytest {params.args} --junitxml=$OLDPWD/{output.junit}.tmp) > {log} 2>&1"
        " && mv {output.junit}.tmp {output.junit}"

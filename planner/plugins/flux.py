"""Flux: run the trainer under a Flux cluster that an init container installs into every node pod.

An init container (``flux-installer``) copies a prebuilt Flux view into a shared volume and writes the
broker configuration; the trainer's command is wrapped by an entrypoint script that starts the lead broker
on pod 0 (which runs the original command with ``flux run``) and followers everywhere else. Both scripts
live in the ConfigMap ``<trainjob>-flux-entrypoint``; the brokers authenticate with a CURVE certificate
in the Secret ``<trainjob>-flux-curve``.

The scripts are the same text Trainer v2.3.0 writes, byte for byte, so pods built by either controller
behave alike. Three settings can be changed through env of the runtime's trainer ``node`` container,
overridden by ``spec.trainer.env``: the installer image, the network device and the queue policy.

The certificate is key material: the Secret is planned without data and marked ``generate="flux-curve"``,
and the applier fills it in. Trainer derives the key from the TrainJob's UID and applies the Secret on
every reconcile; the UID is no secret (every event on the bus carries it), so here the key is random and
the Secret is created once (``if-absent``), like the MPI key. Trainer's Flux Secret is not immutable, and
neither is this one. The ConfigMap is applied on every plan, as Trainer does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import msgspec

from contracts import trainer as t
from contracts.kube import ConfigMap, Secret
from contracts.trainer import FluxMLPolicySource, TrainJob
from contracts.values import is_set, name_of, namespace_of, or_default
from planner.framework import ComponentBuilder, CustomValidation, EnforceMLPolicy, FieldError, RuntimeGated
from planner.info import Component, Container, RuntimeInfo
from planner.merge import Obj, gpus_per_node, upsert_volume_mounts, upsert_volumes
from planner.owners import owned_metadata
from planner.runtime_info import node_resources, trainer_of

_FLUX_VIEW_IMAGE_HOST = "ghcr.io"
FLUX_VIEW_IMAGE_DEFAULT = f"{_FLUX_VIEW_IMAGE_HOST}/converged-computing/flux-view-ubuntu:tag-jammy"
"""The installer image unless the runtime or the TrainJob sets ``FLUX_VIEW_IMAGE`` (Trainer's default)."""

SETTING_DEFAULTS: Mapping[str, str] = {
    t.FLUX_ENV_VIEW_IMAGE: FLUX_VIEW_IMAGE_DEFAULT,
    t.FLUX_ENV_NETWORK_DEVICE: t.FLUX_NETWORK_DEVICE,
    t.FLUX_ENV_QUEUE_POLICY: t.FLUX_QUEUE_POLICY,
}

ENTRYPOINT_KEY = "entrypoint.sh"
INIT_KEY = "init.sh"
CURVE_CERT_KEY = "curve.cert"
ENTRYPOINT_CONFIGMAP_SUFFIX = "-flux-entrypoint"
CURVE_SECRET_SUFFIX = "-flux-curve"
VIEW_ROOT = "/opt/view"
"""Where the Flux view lives inside the installer image."""
CONFIG_VOLUME_MODE = 0o755
CURVE_VOLUME_MODE = 0o400


def entrypoint_config_map_name(job_name: str) -> str:
    return job_name + ENTRYPOINT_CONFIGMAP_SUFFIX


def curve_secret_name(job_name: str) -> str:
    return job_name + CURVE_SECRET_SUFFIX


def _flux_policy(info: RuntimeInfo) -> FluxMLPolicySource | None:
    policy = info.ml_policy
    if policy is None or not is_set(policy.flux):
        return None
    return policy.flux


# ------------------------------------------------------------------------------------------- inputs


def settings(info: RuntimeInfo, job: TrainJob) -> dict[str, str]:
    """Defaults, then literal values of the runtime trainer ``node`` env, then ``spec.trainer.env``.

    As in Trainer, a TrainJob env entry wins even when it has no literal value (it then sets "").
    """
    out = dict(SETTING_DEFAULTS)
    container = info.trainer_container(t.NODE)
    if container is not None:
        for env in container.env:
            name = env.get("name")
            if name in out and "value" in env:
                out[name] = str(env["value"])
    trainer = trainer_of(job)
    if trainer is not None:
        for user_env in or_default(trainer.env, []):
            if user_env.name in out:
                out[user_env.name] = or_default(user_env.value, "")
    return out


def num_nodes(info: RuntimeInfo, job: TrainJob) -> int:
    """``spec.trainer.numNodes``; Trainer dereferences it unchecked, we fall back to the policy's value."""
    trainer = trainer_of(job)
    if trainer is not None and is_set(trainer.num_nodes):
        return trainer.num_nodes
    policy = info.ml_policy
    return or_default(policy.num_nodes, 1) if policy is not None else 1


def tasks_per_node(flux: FluxMLPolicySource, job: TrainJob) -> int:
    trainer = trainer_of(job)
    if trainer is not None and is_set(trainer.num_proc_per_node):
        return trainer.num_proc_per_node
    return or_default(flux.num_proc_per_node, 1)


def original_command(info: RuntimeInfo) -> str:
    """The trainer's command and args as one line: the TrainJob's where set, else the runtime's command."""
    container = info.trainer_container(t.NODE)
    command = list(container.command or []) if container is not None else []
    if info.trainer_command is not None:
        command = list(info.trainer_command)
    args = list(info.trainer_args) if info.trainer_args is not None else []
    return " ".join(command + args).strip()


def index_range(size: int, start: int = 0) -> str:
    """A Flux idset: ``"3"`` for one index, ``"0-3"`` for several."""
    return str(start) if size == 1 else f"{start}-{start + size - 1}"


def hostlist(job_name: str, size: int) -> str:
    return f"{job_name}-{t.NODE}-0-[{index_range(size)}]"


# ------------------------------------------------------------------------------------------ scripts

_PLACEHOLDER = re.compile(r"@@(\w+)@@")


def _render(lines: Iterable[str], values: Mapping[str, str]) -> str:
    """Join lines (each ending in a newline) and fill ``@@name@@`` placeholders in one pass."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], "".join(line + "\n" for line in lines))


_SCRIPT_HEADER = (
    "# Copyright The Kubeflow Authors.",
    "#",
    '# Licensed under the Apache License, Version 2.0 (the "License");',
    "# you may not use this file except in compliance with the License.",
    "# You may obtain a copy of the License at",
    "#",
    "#     http://www.apache.org/licenses/LICENSE-2.0",
    "#",
    "# Unless required by applicable law or agreed to in writing, software",
    '# distributed under the License is distributed on an "AS IS" BASIS,',
    "# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.",
    "# See the License for the specific language governing permissions and",
    "# limitations under the License.",
    "",
    "#!/bin/sh",
)

_BROKER_TOML = (
    "[access]",
    "allow-guest-user = true",
    "allow-root-owner = true",
    "",
    "# Point to resource definition generated with flux-R(1).",
    "[resource]",
    'path = "/mnt/flux/config/etc/flux/system/R"',
    "",
    "[bootstrap]",
    'curve_cert = "/mnt/flux/config/etc/curve/curve.cert"',
    "default_port = 8050",
    'default_bind = "@@bind@@"',
    'default_connect = "@@connect@@"',
    "hosts = [",
    '{ host="@@hosts@@"},',
    "]",
    "",
    "[archive]",
    'dbpath = "/mnt/flux/config/var/lib/flux/job-archive.sqlite"',
    'period = "1m"',
    'busytimeout = "50s"',
    "",
    "[sched-fluxion-qmanager]",
    'queue-policy = "@@queue_policy@@"',
)

_INIT_BODY = (
    "fluxroot=@@flux_root@@",
    "mainHost=@@main_host@@",
    "",
    '# We need to "install" config assets separately. We may not have write to /opt/view.',
    "installRoot=/mnt/flux/config",
    'echo "Hello I am hostname $(hostname) running setup."',
    "",
    "# Always use verbose, no reason to not here",
    'echo "Flux install root: ${fluxroot}"',
    "export fluxroot",
    "",
    "# Add flux to the path (if using view)",
    "export PATH=/opt/view/bin:$PATH",
    "",
    "# If the view doesn't exist, ensure basic paths do",
    "mkdir -p $fluxroot/bin",
    "",
    "# Cron directory",
    "mkdir -p $installRoot/etc/flux/system/cron.d",
    "mkdir -p $installRoot/var/lib/flux",
    "",
    "# These actions need to happen on all hosts",
    "mkdir -p $installRoot/etc/flux/system",
    'hosts="@@hosts@@"',
    "",
    "# Echo hosts here in case the main container needs to generate",
    'echo "${hosts}" > ${installRoot}/etc/flux/system/hostlist',
    "",
    "# Write the broker configuration",
    "mkdir -p ${installRoot}/etc/flux/config",
    "cat <<EOT >> ${installRoot}/etc/flux/config/broker.toml",
    "@@broker_config@@",
    "EOT",
    "",
    "echo",
    'echo "\U0001f438 Broker Configuration"',
    "cat ${installRoot}/etc/flux/config/broker.toml",
    "",
    "# The rundir needs to be created first, and owned by user flux",
    "# Along with the state directory and curve certificate",
    "mkdir -p ${installRoot}/run/flux ${installRoot}/etc/curve",
    "",
    "viewroot=/mnt/flux",
    "mkdir -p $viewroot/view",
    "",
    "# Now prepare to copy finished spack view over",
    'echo "Moving content from /opt/view to be in shared volume at $viewroot"',
    "# Note that /opt/view is a symlink to here",
    "view=$(ls /opt/views/._view/)",
    'view="/opt/views/._view/${view}"',
    "",
    "# We have to move both of these paths - spack makes link to /opt/software",
    "# /opt/software will need to be restored in application container",
    "cp -R ${view}/* $viewroot/view",
    "cp -R /opt/software $viewroot/",
    "",
    "# This is a marker to indicate the copy is done",
    "touch $viewroot/flux-operator-done.txt",
    'echo "Application is done."',
)

_BROKER_OPTIONS = (
    'brokerOptions="-Scron.directory=${configroot}/etc/flux/system/cron.d \\',
    "  -Stbon.fanout=256 \\",
    "  -Srundir=${configroot}/run/flux  \\",
    "  -Sstatedir=${STATE_DIR} -Slocal-uri=local://$configroot/run/flux/local \\",
    "  -Slog-stderr-level=0  \\",
    '  -Slog-stderr-mode=local"',
)

_CYCLONE = "\U0001f300"

_ENTRYPOINT_BODY = (
    "",
    "fluxuser=$(whoami)",
    "fluxuid=$(id -u $fluxuser)",
    "",
    "# Ensure spack view is on the path, wherever it is mounted",
    'viewbase="/mnt/flux"',
    "viewroot=${viewbase}/view",
    "configroot=${viewbase}/config",
    'software="${viewbase}/software"',
    'viewbin="${viewroot}/bin"',
    "fluxpath=${viewbin}/flux",
    "",
    "# Important to add AFTER in case software in container duplicated (e.g., Python)",
    "export PATH=$PATH:${viewbin}",
    "",
    "# Copy mount software to /opt/software",
    "cp -R ${viewbase}/software/* /opt/software/",
    "",
    "# Flux should use the Python with its install",
    "foundroot=$(find $viewroot -maxdepth 2 -type d -path $viewroot/lib/python3*) > /dev/null 2>&1",
    "pythonversion=$(basename ${foundroot})",
    "pythonversion=${viewroot}/bin/${pythonversion}",
    'echo "Python version: $pythonversion"',
    'echo "Python root: $foundroot"',
    "",
    "# If we found the right python, ensure it's linked (old link does not work)",
    'if [[ -f "${pythonversion}" ]]; then',
    "   rm -rf $viewroot/bin/python3",
    "   rm -rf $viewroot/bin/python",
    "   ln -s ${pythonversion} $viewroot/lib/python  || true",
    "   ln -s ${pythonversion} $viewroot/lib/python3 || true",
    "fi",
    "",
    "# Ensure we have flux's python on the path",
    'export PYTHONPATH=${PYTHONPATH:-""}:${foundroot}/site-packages',
    "export FLUX_RC_EXTRA=$viewroot/etc/flux/rc1.d",
    "",
    "# Write a script to load fluxion",
    "cat <<EOT >> /tmp/load-fluxion.sh",
    "flux module remove sched-simple",
    "flux module load sched-fluxion-resource",
    "flux module load sched-fluxion-qmanager",
    "EOT",
    "mv /tmp/load-fluxion.sh ${viewbase}/load-fluxion.sh",
    "",
    "# Write an easy file we can source for the environment",
    "cat <<EOT >> /tmp/flux-view.sh",
    "#!/bin/bash",
    "export PATH=$PATH",
    "export PYTHONPATH=$PYTHONPATH",
    'export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-""}:$viewroot/lib',
    "export fluxsocket=local://${configroot}/run/flux/local",
    "EOT",
    "mv /tmp/flux-view.sh ${viewbase}/flux-view.sh",
    "",
    "# Variables we can use again",
    'cfg="${configroot}/etc/flux/config"',
    'command="$@"',
    "",
    "# Copy mounted curve to expected location",
    "curvepath=/mnt/flux/config/etc/curve/curve.cert",
    "cp /curve/curve.cert ${curvepath}",
    "",
    "# Remove group and other read",
    "chmod o-r ${curvepath}",
    "chmod g-r ${curvepath}",
    "chown -R ${fluxuid} ${curvepath}",
    "",
    "# Generate host resources",
    "hosts=$(cat ${configroot}/etc/flux/system/hostlist)",
    "flux R encode --hosts=${hosts} @@resources@@ > /tmp/R",
    "mv /tmp/R ${configroot}/etc/flux/system/R",
    "",
    "# Put the state directory in /var/lib on shared view",
    "export STATE_DIR=${configroot}/var/lib/flux",
    "export FLUX_OUTPUT_DIR=/tmp/fluxout",
    "mkdir -p ${STATE_DIR} ${FLUX_OUTPUT_DIR}",
    "",
    "# Main host <name>-0 and the fully qualified domain name",
    'mainHost="@@main_host@@"',
    "workdir=$(pwd)",
    "",
    "# Make cron.d directory",
    "mkdir -p ${configroot}/etc/flux/system/cron.d",
    *_BROKER_OPTIONS,
    "",
    "# Run an interactive cluster, giving no command to flux start",
    "run_interactive_cluster() {",
    f'    echo "{_CYCLONE} flux broker --config-path ${{cfg}} ${{brokerOptions}}"',
    "    flux broker --config-path ${cfg} ${brokerOptions}",
    "}",
    "",
    "# Start flux with the original entrypoint",
    'if [ "$(hostname)" = "${mainHost}" ]; then',
    "",
    '  echo "Command provided is: ${command}"',
    '  if [ -z "${command}" ]; then',
    "    run_interactive_cluster",
    "  else",
    "",
    "    # If tasks are == 0, then only define nodes",
    '    flags="@@flags@@  "',
    '    echo "Flags for flux are ${flags}"',
    f'    echo "{_CYCLONE} flux start  -o --config ${{cfg}} ${{brokerOptions}} flux submit ${{flags}} '
    '--quiet --watch ${command}"',
    "\tflux start  -o --config ${cfg} ${brokerOptions} flux run ${flags} ${command}",
    "  fi",
    "",
    "# Block run by workers",
    "else",
    "",
    "    # We basically sleep/wait until the lead broker is ready",
    f'    echo "{_CYCLONE} flux start  -o --config ${{configroot}}/etc/flux/config ${{brokerOptions}}"',
    "",
    "    # We can keep trying forever, don't care if worker is successful or not",
    "    # Unless retry count is set, in which case we stop after retries",
    "    while true",
    "    do",
    "        flux start -o --config ${configroot}/etc/flux/config ${brokerOptions}",
    "        retval=$?",
    '        if [[ "${retval}" -eq 0 ]] || [[ "false" == "true" ]]; then',
    '             echo "The follower worker exited cleanly. Goodbye!"',
    "             break",
    "        fi",
    '        echo "Return value for follower worker is ${retval}"',
    '        echo "\U0001f62a Sleeping 15s to try again..."',
    "        sleep 15",
    "    done",
    "fi",
    "",
    "# Marker of completion, if needed",
    "touch $viewbase/flux-operator-complete.txt",
)


def broker_config(job: TrainJob, hosts: str, setting: Mapping[str, str]) -> str:
    """broker.toml; peers are addressed as ``<host>.<trainjob>.<namespace>.svc.cluster.local``."""
    fqdn = f"{name_of(job)}.{namespace_of(job)}.svc.cluster.local"
    return _render(
        _BROKER_TOML,
        {
            "bind": f"tcp://{setting[t.FLUX_ENV_NETWORK_DEVICE]}:%p",
            "connect": f"tcp://%h.{fqdn}:%p",
            "hosts": hosts,
            "queue_policy": setting[t.FLUX_ENV_QUEUE_POLICY],
        },
    )


def init_script(job: TrainJob, nodes: int, setting: Mapping[str, str]) -> str:
    hosts = hostlist(name_of(job), nodes)
    return _render(
        (*_SCRIPT_HEADER, *_INIT_BODY),
        {
            "flux_root": VIEW_ROOT,
            "main_host": f"{name_of(job)}-0",
            "hosts": hosts,
            "broker_config": broker_config(job, hosts, setting),
        },
    )


def entrypoint_script(job: TrainJob, nodes: int, tasks: int, gpus: int) -> str:
    flags = f"-N {nodes} -n {tasks * nodes}"
    resources = f"--cores={index_range(tasks)}"
    if gpus > 0:
        flags += f" -g {gpus}"
        resources += f" --gpu={index_range(gpus)}"
    return _render(
        (*_SCRIPT_HEADER, *_ENTRYPOINT_BODY),
        {"resources": resources, "main_host": f"{name_of(job)}-{t.NODE}-0-0", "flags": flags},
    )


# ------------------------------------------------------------------------------------------- plugin


class Flux:
    name = "flux"

    def enabled(self, info: RuntimeInfo) -> bool:
        return _flux_policy(info) is not None

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        flux = _flux_policy(info)
        if flux is None:
            return []
        errors: list[FieldError] = []
        trainer = trainer_of(job)
        nproc = flux.num_proc_per_node
        if trainer is not None and is_set(trainer.num_proc_per_node):
            nproc = trainer.num_proc_per_node
        if is_set(nproc) and nproc < 1:
            errors.append(
                FieldError("spec.trainer.numProcPerNode", "must be greater than or equal to 1 for Flux TrainJob")
            )
        for ps in info.pod_sets:
            if ps.name != t.NODE:
                continue
            errors.extend(
                FieldError("spec.trainer.initContainers", f"InitContainer '{t.FLUX_INSTALLER_CONTAINER}' is reserved")
                for ic in ps.init_containers
                if ic.name == t.FLUX_INSTALLER_CONTAINER
            )
        return errors

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        if _flux_policy(info) is None:
            return
        job_name = name_of(job)
        config_map = entrypoint_config_map_name(job_name)
        setting = settings(info, job)

        command = ["/bin/bash", f"{t.FLUX_CONFIG_MOUNT_PATH}/{ENTRYPOINT_KEY}", original_command(info)]
        info.trainer_command = command
        info.trainer_args = None
        if trainer_of(job) is None:
            # Trainer panics without spec.trainer (upstream #4076). The JobSet builder applies the trainer
            # command only when spec.trainer is set, so carry the wrapped command on the pod set instead.
            trainer_node = info.trainer_container(t.NODE)
            if trainer_node is not None:
                trainer_node.command = list(command)

        install_mount: Obj = {"name": t.FLUX_INSTALL_VOLUME, "mountPath": t.FLUX_INSTALL_PATH}
        config_mount: Obj = {"name": config_map, "mountPath": t.FLUX_CONFIG_MOUNT_PATH, "readOnly": True}
        for ps in info.pod_sets:
            if ps.name != t.NODE:
                continue
            upsert_volumes(
                ps.volumes,
                [
                    {"name": t.FLUX_SPACK_VOLUME, "emptyDir": {}},
                    {"name": t.FLUX_INSTALL_VOLUME, "emptyDir": {}},
                    {"name": config_map, "configMap": {"name": config_map, "defaultMode": CONFIG_VOLUME_MODE}},
                    {"name": t.FLUX_MEMORY_VOLUME, "emptyDir": {"medium": "Memory"}},
                ],
            )
            upsert_volumes(
                ps.volumes,
                [
                    {
                        "name": t.FLUX_CURVE_VOLUME,
                        "secret": {"secretName": curve_secret_name(job_name), "defaultMode": CURVE_VOLUME_MODE},
                    }
                ],
            )
            ps.init_containers.append(
                Container(
                    name=t.FLUX_INSTALLER_CONTAINER,
                    image=setting[t.FLUX_ENV_VIEW_IMAGE],
                    command=["/bin/bash", f"{t.FLUX_CONFIG_MOUNT_PATH}/{INIT_KEY}"],
                    volume_mounts=[dict(install_mount), dict(config_mount)],
                )
            )
            for container in ps.containers:
                if container.name != t.NODE:
                    continue
                upsert_volume_mounts(
                    container.volume_mounts,
                    [
                        dict(install_mount),
                        {"name": t.FLUX_SPACK_VOLUME, "mountPath": t.FLUX_SPACK_PATH},
                        dict(config_mount),
                        {"name": t.FLUX_CURVE_VOLUME, "mountPath": t.FLUX_CURVE_PATH, "readOnly": True},
                        {"name": t.FLUX_MEMORY_VOLUME, "mountPath": t.FLUX_MEMORY_PATH, "readOnly": True},
                    ],
                )

    def sync_parallel_count(self, info: RuntimeInfo) -> None:
        return None

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        flux = _flux_policy(info)
        if flux is None:
            return []
        nodes = num_nodes(info, job)
        setting = settings(info, job)
        gpus = gpus_per_node(node_resources(info, job))
        config_map = msgspec.convert(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": owned_metadata(job, entrypoint_config_map_name(name_of(job))),
                "data": {
                    ENTRYPOINT_KEY: entrypoint_script(job, nodes, tasks_per_node(flux, job), gpus),
                    INIT_KEY: init_script(job, nodes, setting),
                },
            },
            ConfigMap,
        )
        secret = msgspec.convert(
            {"apiVersion": "v1", "kind": "Secret", "metadata": owned_metadata(job, curve_secret_name(name_of(job)))},
            Secret,
        )
        return [Component(object=config_map), Component(object=secret, policy="if-absent", generate="flux-curve")]


# The extension points Flux implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*Flux)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_validation: CustomValidation = Flux()
_implements_ml_policy: EnforceMLPolicy = Flux()
_implements_builder: ComponentBuilder = Flux()
_implements_gate: RuntimeGated = Flux()

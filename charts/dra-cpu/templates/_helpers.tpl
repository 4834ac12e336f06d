{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "dra-cpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name of the namespaced objects. */}}
{{- define "dra-cpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: two releases in two
     namespaces must not fight over one ClusterRole. */}}
{{- define "dra-cpu.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "dra-cpu.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-cpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-cpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dra-cpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dra-cpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dra-cpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dra-cpu.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-cpu.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "dra-cpu.deviceClassName" -}}
{{- default .Values.driverName .Values.deviceClass.name -}}
{{- end -}}

{{/* The coordination socket; it must lie under stateDir, the only host
     directory both containers share. */}}
{{- define "dra-cpu.coordinationSocket" -}}
{{- $stateDir := trimSuffix "/" .Values.stateDir -}}
{{- $socket := default (printf "%s/coordination.sock" $stateDir) .Values.coordinationSocket -}}
{{- if not (hasPrefix (printf "%s/" $stateDir) $socket) -}}
{{- fail (printf "coordinationSocket %q must lie under stateDir %q: that is the directory both containers mount" $socket .Values.stateDir) -}}
{{- end -}}
{{- $socket -}}
{{- end -}}

{{/* Where the host's /sys is mounted; the plugin's --sysfs-root is its parent. */}}
{{- define "dra-cpu.hostRoot" -}}/host{{- end -}}

{{/* The config file of dra-plugin; keys are the flag names. */}}
{{- define "dra-cpu.draPluginConfig" -}}
{{- $p := .Values.draPlugin -}}
driver-name: {{ .Values.driverName | quote }}
kubelet-root-dir: {{ .Values.kubeletRootDir | quote }}
state-dir: {{ .Values.stateDir | quote }}
cdi-dir: {{ .Values.cdiDir | quote }}
sysfs-root: {{ include "dra-cpu.hostRoot" . | quote }}
{{- with .Values.reservedCpus }}
reserved-cpus: {{ . | quote }}
{{- end }}
cpu-device-mode: {{ $p.cpuDeviceMode }}
group-by: {{ $p.groupBy }}
allocation-policy: {{ $p.allocationPolicy }}
min-shared-cpus: {{ int $p.minSharedCpus }}
mixed-allocation-mode: {{ .Values.mixedAllocationMode }}
disable-node-allocatable-mapping: {{ $p.disableNodeAllocatableMapping }}
disable-device-metadata: {{ $p.disableDeviceMetadata }}
device-metadata-dir: {{ $p.deviceMetadataDir | quote }}
expose-pcie-roots: {{ $p.exposePcieRoots }}
low-latency-tuning: {{ $p.lowLatencyTuning }}
procfs-root: {{ printf "%s/proc" (include "dra-cpu.hostRoot" .) | quote }}
irqbalance-dir: {{ printf "%s/run/irqbalance" (include "dra-cpu.hostRoot" .) | quote }}
daemonset: {{ printf "%s/%s" .Release.Namespace (include "dra-cpu.fullname" .) | quote }}
{{- /* Mounted only with lowLatencyTuning and nri-plugin, which makes the
partitions: elsewhere loadBalancing off is refused (no hierarchy there). */}}
cgroup-root: /host-cgroup
coordination-socket: {{ include "dra-cpu.coordinationSocket" . | quote }}
coordination-allowed-uids: [{{ join ", " $p.coordinationAllowedUids }}]
metrics-address: "[::]:{{ $p.metricsPort }}"
log-format: {{ $p.logFormat }}
{{- if $p.kubeconfigSecret }}
kubeconfig: {{ include "dra-cpu.kubeconfigPath" . | quote }}
{{- end }}
{{- end -}}

{{/* The config file of nri-plugin; keys are the flag names. */}}
{{- define "dra-cpu.nriPluginConfig" -}}
{{- $n := .Values.nri -}}
nri-socket: {{ $n.socket | quote }}
plugin-name: {{ $n.pluginName | quote }}
plugin-index: {{ include "dra-cpu.pluginIndex" . | quote }}
coordination-socket: {{ include "dra-cpu.coordinationSocket" . | quote }}
cdi-dir: {{ .Values.cdiDir | quote }}
sysfs-root: {{ include "dra-cpu.hostRoot" . | quote }}
{{- with .Values.reservedCpus }}
reserved-cpus: {{ . | quote }}
{{- end }}
mixed-allocation-mode: {{ .Values.mixedAllocationMode }}
unsolicited-updates: {{ $n.unsolicitedUpdates }}
align-memory: {{ $n.alignMemory }}
metrics-address: "[::]:{{ $n.metricsPort }}"
log-format: {{ $n.logFormat }}
state-dir: {{ $n.stateDir | quote }}
{{- /* Set even when no host cgroup is listed: where the hierarchy is not
mounted, cgroups a previous run managed are kept for a later restore, not
looked up in the container's own cgroup namespace. */}}
cgroup-root: /host-cgroup
cpuset-check-seconds: {{ int $n.cpusetCheckSeconds }}
{{- with $n.hostCgroups }}
host-cgroups: {{ toJson . }}
{{- end }}
{{- end -}}

{{/* The NRI plugin index as two digits; --set turns "10" into a number. */}}
{{- define "dra-cpu.pluginIndex" -}}
{{- $index := .Values.nri.pluginIndex -}}
{{- if kindIs "string" $index -}}{{ $index }}{{- else -}}{{ printf "%02d" (int $index) }}{{- end -}}
{{- end -}}

{{/* Checks across values that the schema cannot express. */}}
{{- define "dra-cpu.validate" -}}
{{- if and .Values.nri.enabled (eq (int .Values.draPlugin.metricsPort) (int .Values.nri.metricsPort)) -}}
{{- fail (printf "draPlugin.metricsPort and nri.metricsPort are both %v: the two containers share the pod's network, so the ports must differ" .Values.draPlugin.metricsPort) -}}
{{- end -}}
{{- $uid := .Values.securityContext.runAsUser | default 0 | int -}}
{{- $allowed := list -}}
{{- range .Values.draPlugin.coordinationAllowedUids -}}{{- $allowed = append $allowed (int .) -}}{{- end -}}
{{- if and .Values.nri.enabled (not (has $uid $allowed)) -}}
{{- fail (printf "securityContext.runAsUser %d is not in draPlugin.coordinationAllowedUids %v: nri-plugin would be refused on the coordination socket" $uid .Values.draPlugin.coordinationAllowedUids) -}}
{{- end -}}
{{- $root := trimSuffix "/" .Values.kubeletRootDir -}}
{{- $registration := printf "%s/plugins_registry/%s-reg.sock" $root .Values.driverName -}}
{{- $endpoint := printf "%s/plugins/%s/dra.sock" $root .Values.driverName -}}
{{- range $socket := list $registration $endpoint (include "dra-cpu.coordinationSocket" $) -}}
{{- if gt (len $socket) 107 -}}
{{- fail (printf "the socket path %s is %d bytes, past the 107 a Unix socket path may have: shorten kubeletRootDir, driverName or stateDir" $socket (len $socket)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The containers' securityContext: a privileged container may not also
     forbid privilege escalation (the API server refuses the pair), so the
     default allowPrivilegeEscalation: false gives way to privileged: true. */}}
{{- define "dra-cpu.securityContext" -}}
{{- $context := deepCopy .Values.securityContext -}}
{{- if $context.privileged -}}
{{- $_ := unset $context "allowPrivilegeEscalation" -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}

{{/* Where draPlugin.kubeconfigSecret's file is mounted in dra-plugin. */}}
{{- define "dra-cpu.kubeconfigPath" -}}
/etc/dra-cpu-kubeconfig/kubeconfig
{{- end -}}

package testkit

// ProcStatus is /proc/PID/status of a process with 85232 kB resident and
// 180312 kB of data: procfs's parser and probe's sampler (on a fake /proc)
// read the same lines.
const ProcStatus = `Name:	nixlctl
Umask:	0022
State:	S (sleeping)
VmPeak:	 1298520 kB
VmSize:	 1233048 kB
VmRSS:	   85232 kB
RssAnon:	   40000 kB
VmData:	  180312 kB
VmStk:	     132 kB
Threads:	9
`

#!/usr/bin/env bash
# Re-points section citations at docs/design.md: every citation by section sign in the
# tracked *.go, *.md, *.yaml/*.yml files, Makefiles and scripts/ becomes
# "docs/design.md <sign>N" (a group such as "<sign>2.4, <sign>3.1" keeps one prefix), and a
# citation naming the design brief that used to live outside the repository (its name, with
# or without ".md" or "'s", then a section sign or the word "section") is rewritten the same
# way. A number docs/design.md has no heading for is
# left as it is and reported; the script then exits 1, and that comment must be fixed by
# hand (say what it means, or drop the citation). Idempotent: a citation that already names
# design.md is only checked. docs/design.md itself is not rewritten (its bare section signs
# are self-references).
#
#   scripts/cite-design.sh          rewrite in place, report what it could not
#   scripts/cite-design.sh --check  change nothing; exit 1 if anything would change
#
# internal/designdoc's test fails on the same problems, so `make test` keeps them out.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=write
case "${1:-}" in
--check) mode=check ;;
"") ;;
*)
	echo "usage: scripts/cite-design.sh [--check]" >&2
	exit 2
	;;
esac

design=docs/design.md
[[ -f $design ]] || {
	echo "cite-design: $design is missing" >&2
	exit 1
}

# The section numbers docs/design.md has: "## 3. Title" gives 3, "### 3.1 Title" gives 3.1.
sections=$(perl -ne 'print "$1\n" if /^#{2,}\s+(\d+(?:\.\d+)?)[.\s]/' "$design" | sort -u | tr '\n' ' ')

mapfile -t files < <(git ls-files -- '*.go' '*.md' '*.yaml' '*.yml' 'Makefile' '*/Makefile' 'scripts/*' |
	grep -v -x -F "$design" | grep -v '^tools/' || true)

SECTIONS="$sections" MODE="$mode" perl -CSD -Mutf8 -e '
use strict; use warnings;
my %have = map { $_ => 1 } split " ", $ENV{SECTIONS};
my $sign = "\x{a7}";
my $num  = qr/\d+(?:\.\d+)?/;
my $cont = qr/(?:,\s*|\s*\/\s*|\s+and\s+|\s+or\s+)$sign$num/;
# A citation group: an optional old-brief prefix, a number, continuations.
my $brief = "S" . "PEC";
my $group = qr/(?<pre>$brief(?:\.md)?(?:\x{27}s)?\s+)?$sign(?<first>$num)(?<rest>$cont*)/;
my $sectionWord = qr/$brief\s+section\s+(?<n>$num)/;
my ($changed, $bad) = (0, 0);
for my $file (@ARGV) {
	next unless -f $file; # listed by git but deleted in the work tree
	open(my $in, "<:encoding(UTF-8)", $file) or die "$file: $!";
	my @lines = <$in>;
	close $in;
	my $dirty = 0;
	for my $i (0 .. $#lines) {
		my $line = $lines[$i];
		my $out = "";
		my $pos = 0;
		my $edit = sub {
			my ($start, $len, $nums, $repl) = @_;
			my @missing = grep { !$have{$_} } @$nums;
			$out .= substr($line, $pos, $start - $pos);
			my $orig = substr($line, $start, $len);
			if (@missing) {
				printf STDERR "%s:%d: cites %s, which docs/design.md has no section for: %s\n",
					$file, $i + 1, join(", ", map { "$sign$_" } @missing), $orig;
				$bad++;
				$out .= $orig;
			} else {
				$out .= $repl;
			}
			$pos = $start + $len;
		};
		while ($line =~ /$sectionWord|$group/g) {
			my ($start, $len) = ($-[0], $+[0] - $-[0]);
			if (defined $+{n}) {
				$edit->($start, $len, [$+{n}], "docs/design.md section $+{n}");
				next;
			}
			my ($pre, $first, $rest) = ($+{pre}, $+{first}, $+{rest} // "");
			my @nums = ($first, $rest =~ /$sign($num)/g);
			my $body = substr($line, $start + (defined $pre ? length $pre : 0));
			$body = substr($body, 0, $len - (defined $pre ? length $pre : 0));
			my $before = substr($line, 0, $start);
			if (!defined $pre && $before =~ /design\.md\s+$/) {
				$edit->($start, $len, \@nums, $body); # already cites design.md: check only
			} else {
				$edit->($start, $len, \@nums, "docs/design.md $body");
			}
		}
		$out .= substr($line, $pos);
		if ($out ne $line) { $lines[$i] = $out; $dirty = 1; }
	}
	next unless $dirty;
	$changed++;
	if ($ENV{MODE} eq "check") { print "would rewrite $file\n"; next; }
	open(my $fh, ">:encoding(UTF-8)", $file) or die "$file: $!";
	print $fh @lines;
	close $fh;
	print "rewrote $file\n";
}
print STDERR "cite-design: $bad citation(s) of sections docs/design.md lacks\n" if $bad;
exit 1 if $bad || ($ENV{MODE} eq "check" && $changed);
' "${files[@]}"

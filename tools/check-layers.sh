#!/bin/sh
# Checks two layerings.
#
# The folders of src/, by their #include lines: base includes nothing of
# src/ but itself, memory only base, core only base and memory, and a
# backend folder (src/backends/NAME) only itself, src/backends/common, base
# and memory; src/backends/common only itself, base and memory. The public
# headers (cubert/...) may be included anywhere. So the layers read
# base < memory < core, base < memory < common < each backend, and no
# include points up or sideways.
#
# The files of the CUDA backend, which call each other in one direction
# only. cuda_internal.h lists the files from the bottom layer up (the lines
# " *   cuda_NAME.c  what it holds" of its first comment); a file may call,
# or take the address of, only functions defined in files listed before
# it. Also checked: every cuda_*.c file is listed, no function is defined
# in two files, and each "--- cuda_NAME.c ---" section of the header
# declares only functions of that file (its inline helpers count as code
# of that file).
#
# Usage: tools/check-layers.sh [BACKEND_DIR]   (default src/backends/cuda;
# the src/ folder checked is the one two levels above it)
# Exit status 0 when both layerings hold, 1 with the offending includes or
# calls listed.
set -eu
dir=${1:-src/backends/cuda}
[ -f "$dir/cuda_internal.h" ] || {
    echo "check-layers: no $dir/cuda_internal.h" >&2
    exit 2
}
src=$(cd "$dir/../.." && pwd)

folders=0
perl -e '
use strict;
use warnings;
use File::Find;

my $src = $ARGV[0];
my $status = 0;
my $files = 0;
# What each layer may include, besides the public headers.
my %may = (
    "base"   => ["base"],
    "memory" => ["base", "memory"],
    "core"   => ["base", "memory", "core"],
    "backends/common" => ["base", "memory", "backends/common"],
);
sub allowed {
    my ($layer) = @_;
    return @{$may{$layer}} if $may{$layer};
    return ("base", "memory", "backends/common", $layer)
        if $layer =~ m{^backends/\w+$};
    return ();
}
find({ no_chdir => 1, wanted => sub {
    return unless /\.[ch]$/;
    my $rel = substr($File::Find::name, length($src) + 1);
    my ($layer) = $rel =~ m{^(backends/\w+|\w+)/};
    return unless defined $layer;
    my @ok = allowed($layer);
    unless (@ok) {
        print STDERR "check-layers: $rel is in no layer (base, memory, core, backends/NAME)\n";
        $status = 1;
        return;
    }
    $files++;
    open(my $fh, "<", $File::Find::name) or die "check-layers: $rel: $!\n";
    while (my $line = <$fh>) {
        next unless $line =~ /^\s*#\s*include\s*"([^"]+)"/;
        my $inc = $1;
        next if $inc =~ m{^cubert/};
        my ($to) = $inc =~ m{^(backends/\w+|\w+)/};
        unless (defined $to && grep { $_ eq $to } @ok) {
            printf STDERR "check-layers: %s:%d includes \"%s\": %s may include only %s and cubert/\n",
                $rel, $., $inc, $layer, join(", ", @ok);
            $status = 1;
        }
    }
    close($fh);
}}, map { "$src/$_" } grep { -d "$src/$_" } qw(base memory core backends));
printf "check-layers: %d files of src/ include down only: base < memory < core; base < memory < backends/common < backends/NAME\n", $files
    if $status == 0;
exit $status;
' "$src" || folders=1

calls=0
perl -e '
use strict;
use warnings;

my $dir = $ARGV[0];

sub slurp {
    my ($path) = @_;
    open(my $fh, "<", $path) or die "check-layers: $path: $!\n";
    local $/;
    return <$fh>;
}

# Code only: comments, string and character literals removed (newlines
# kept, so line numbers still match).
sub code_of {
    my ($text) = @_;
    $text =~ s{(/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\x27(?:\\.|[^\x27\\\n])+\x27)}{
        my $m = $1;
        $m =~ /^\/\*/ ? ($m =~ tr/\n//cdr) : ($m =~ /^"/ ? "\"\"" : " ")
    }gse;
    return $text;
}

my $header = slurp("$dir/cuda_internal.h");
my ($intro) = $header =~ m{\A(/\*.*?\*/)}s;
my @order = ($intro // "") =~ /^ \*\s+(cuda_\w+\.c)\s/mg;
die "check-layers: cuda_internal.h lists no files in its first comment\n"
    unless @order;
my %rank;
@rank{@order} = (0 .. $#order);

my $status = 0;
sub fail { print STDERR "check-layers: @_\n"; $status = 1; }

opendir(my $dh, $dir) or die "check-layers: $dir: $!\n";
my @files = sort grep { /^cuda_\w+\.c$/ } readdir($dh);
closedir($dh);
for my $f (@files) {
    fail("$f is not listed in the layers of cuda_internal.h")
        unless exists $rank{$f};
}
for my $f (@order) {
    fail("cuda_internal.h lists $f, which does not exist")
        unless -f "$dir/$f";
}

# Functions each file defines with external linkage.
my (%code, %owner);
for my $f (grep { exists $rank{$_} } @files) {
    $code{$f} = code_of(slurp("$dir/$f"));
    while ($code{$f} =~ /^(?!static\b)[A-Za-z_][\w \t*]*?\b(\w+)\s*\([^;{}]*\)\s*\{/mg) {
        my $name = $1;
        if (exists $owner{$name}) {
            fail("$name is defined in $owner{$name} and in $f");
            next;
        }
        $owner{$name} = $f;
    }
}

# The header: code before the first section is seen by every layer and may
# use no function of a file; a section belongs to its file.
my @hparts = split(m{^/\* --- (cuda_\w+\.c) --- \*/$}m, $header);
for (my $i = 0; $i < @hparts; $i += 2) {
    $hparts[$i] = code_of($hparts[$i]);
}
my %section;
for (my $i = 1; $i + 1 < @hparts; $i += 2) {
    my ($f, $text) = ($hparts[$i], $hparts[$i + 1]);
    fail("cuda_internal.h has a section for $f, which is not listed")
        unless exists $rank{$f};
    $section{$f} .= $text;
    for my $name (sort keys %{{ map { $_ => 1 } $text =~ /\b(\w+)\s*\(/g }}) {
        my $g = $owner{$name} // next;
        fail("cuda_internal.h declares $name (defined in $g) in the " .
             "section of $f")
            if $g ne $f && $text =~ /^[A-Za-z_][\w \t*]*?\b\Q$name\E\s*\(/m;
    }
}
for my $name ($hparts[0] =~ /\b(\w+)\b/g) {
    fail("cuda_internal.h uses $name ($owner{$name}) before its sections")
        if exists $owner{$name};
}

# Every use of a function of another file must point down the layers.
for my $f (sort { $rank{$a} <=> $rank{$b} } keys %code) {
    my $text = $code{$f} . ($section{$f} // "");
    my %seen;
    for my $name ($text =~ /\b(\w+)\b/g) {
        my $g = $owner{$name} // next;
        next if $g eq $f || $seen{$name}++;
        fail("$f uses $name of $g, a layer above it")
            if $rank{$g} > $rank{$f};
    }
}

if ($status == 0) {
    printf "check-layers: %d files, %d functions, no call goes up: %s\n",
        scalar(@order), scalar(keys %owner), join(" < ", map { s/\.c$//r } @order);
}
exit $status;
' "$dir" || calls=1
[ "$folders" -eq 0 ] && [ "$calls" -eq 0 ]

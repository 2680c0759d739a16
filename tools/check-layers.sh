#!/bin/sh
# Checks that the files of the CUDA backend call each other in one
# direction only. cuda_internal.h lists the files from the bottom layer up
# (the lines " *   cuda_NAME.c  what it holds" of its first comment); a file
# may call, or take the address of, only functions defined in files listed
# before it. Also checked: every cuda_*.c file is listed, no function is
# defined in two files, and each "--- cuda_NAME.c ---" section of the
# header declares only functions of that file (its inline helpers count as
# code of that file).
#
# Usage: tools/check-layers.sh [BACKEND_DIR]   (default src/backends/cuda)
# Exit status 0 when the layering holds, 1 with the offending calls listed.
set -eu
dir=${1:-src/backends/cuda}
[ -f "$dir/cuda_internal.h" ] || {
    echo "check-layers: no $dir/cuda_internal.h" >&2
    exit 2
}

exec perl -e '
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
' "$dir"

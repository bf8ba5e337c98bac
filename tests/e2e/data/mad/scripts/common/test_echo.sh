#!/bin/bash
# A pre/post script of the test tools (the shape of madengine's scripts/common/test_echo.sh,
# written here): it says its arguments, and where it runs.
echo "$@ (in $(pwd))"

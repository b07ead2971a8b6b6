# a BaseException subclass (not an Exception) escapes the job
class Abort(BaseException):
    pass


raise Abort("stop everything")
